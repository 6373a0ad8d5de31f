"""The device plugin against a fake kubelet on real unix sockets.

The fake kubelet does what the kubelet's device manager does: it dials back on
Register, asks for the options, opens ListAndWatch and calls Allocate. The node
is the simulator's sysfs tree, changed through the same driver writes an apply
makes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from vgpu_state.background import Backoff
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu_state.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface, Vgpu
from vgpu_state.sim.host import SimHost
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet, SeenDevice

REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "configs" / "sim"
T4_4Q = "nvidia.com/GRID_T4-4Q"
T4_8Q = "nvidia.com/GRID_T4-8Q"
U1 = "6b1f3c1e-2d4b-4c1a-9d0e-1f2a3b4c5d6e"
U2 = "7c2a4d2f-3e5c-4d2b-8e1f-2a3b4c5d6e7f"
U3 = "11111111-2222-4333-8444-555555555555"
U4 = "21111111-2222-4333-8444-555555555555"


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short: a unix socket path holds at most 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[DevicePluginKubelet]:
    with DevicePluginKubelet(str(plugin_dir)) as k:
        yield k


@pytest.fixture
def t4() -> Iterator[SimHost]:
    with SimHost(SIM / "t4-pair.yaml") as host:
        yield host


def manager(plugin_dir: Path, **kw: object) -> DevicePluginManager:
    options: dict[str, object] = {
        "backoff": (0.05, 0.1),
        "poll_interval": 0.02,
        "health_interval": 0.05,
        "iommufd": False,
    }
    options.update(kw)
    return DevicePluginManager(str(plugin_dir), **options)  # type: ignore[arg-type]


@pytest.fixture
def plugins(plugin_dir: Path) -> Iterator[DevicePluginManager]:
    m = manager(plugin_dir)
    yield m
    m.stop()


def ids(devices: tuple[SeenDevice, ...]) -> list[str]:
    return sorted(d.id for d in devices)


def test_registers_and_streams_the_full_list_with_numa(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost, plugin_dir: Path
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_registered(T4_4Q)
    reg = kubelet.registrations[0]
    assert reg.endpoint == "vgpu-state-nvidia.com_GRID_T4-4Q.sock"
    assert (plugin_dir / reg.endpoint).is_socket()
    assert reg.options.get_preferred_allocation_available
    seen = kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    assert seen == (SeenDevice(U1, "Healthy", (0,)), SeenDevice(U2, "Healthy", (0,)))
    # The kubelet has the registration before the plugin has the kubelet's answer.
    deadline = time.monotonic() + 5
    while not plugins.status()[T4_4Q].registered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s.registered for s in plugins.status().values()] == [True]


def test_refresh_after_create_and_destroy(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    t4.create_mdev("0000:3b:00.0", 232, U3)
    plugins.refresh(t4.scan())
    assert ids(kubelet.wait_for(T4_4Q, lambda d: len(d) == 3)) == sorted([U1, U2, U3])
    t4.remove_mdev(U1)
    plugins.refresh(t4.scan())
    seen = kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    assert ids(seen) == sorted([U2, U3]) and {d.health for d in seen} == {"Healthy"}
    assert len(kubelet.registrations) == 1


def test_kubelet_restart_reregisters_within_two_seconds(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost, plugin_dir: Path
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    kubelet.restart()  # removes every socket, then serves a new kubelet.sock
    kubelet.wait_registered(T4_4Q, count=2, timeout=2.0)
    assert ids(kubelet.wait_for(T4_4Q, lambda d: len(d) == 2, timeout=2.0)) == sorted([U1, U2])
    assert kubelet.streaming(T4_4Q)
    assert (plugin_dir / "vgpu-state-nvidia.com_GRID_T4-4Q.sock").is_socket()


def test_deleted_socket_alone_reregisters(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost, plugin_dir: Path
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_registered(T4_4Q)
    os.unlink(plugin_dir / "vgpu-state-nvidia.com_GRID_T4-4Q.sock")
    kubelet.wait_registered(T4_4Q, count=2, timeout=2.0)
    assert (plugin_dir / "vgpu-state-nvidia.com_GRID_T4-4Q.sock").is_socket()
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)


def test_stream_ended_by_the_kubelet_reregisters(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    kubelet.drop_stream(T4_4Q)
    kubelet.wait_registered(T4_4Q, count=2, timeout=2.0)
    deadline = time.monotonic() + 2
    while not kubelet.streaming(T4_4Q) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kubelet.streaming(T4_4Q)
    time.sleep(1.0)  # a re-registration must not cause another one
    assert sum(r.resource == T4_4Q for r in kubelet.registrations) == 2


def test_removed_resource_gets_an_empty_list_and_loses_its_socket(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost, plugin_dir: Path
) -> None:
    t4.create_mdev("0000:af:00.0", 233, U3)
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_8Q, lambda d: len(d) == 1)
    t4.remove_mdev(U3)
    plugins.refresh(t4.scan())
    assert kubelet.wait_for(T4_8Q, lambda d: d == ()) == ()
    assert not (plugin_dir / "vgpu-state-nvidia.com_GRID_T4-8Q.sock").exists()
    assert list(plugins.status()) == [T4_4Q]
    # The other resource keeps its two devices (its first list may arrive after T4-8Q's).
    assert len(kubelet.wait_for(T4_4Q, lambda d: d is not None)) == 2


def test_second_resource_appears_while_the_first_streams(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    updates = kubelet.updates(T4_4Q)
    t4.create_mdev("0000:af:00.0", 233, U3)
    t4.create_mdev("0000:af:00.0", 233, U4)
    plugins.refresh(t4.scan())
    seen = kubelet.wait_for(T4_8Q, lambda d: len(d) == 2)
    assert {d.numa_nodes for d in seen} == {(1,)}
    assert kubelet.streaming(T4_4Q) and kubelet.updates(T4_4Q) == updates
    assert [r.resource for r in kubelet.registrations] == [T4_4Q, T4_8Q]


def test_allocate_returns_the_env_var_kubevirt_reads_and_vfio_nodes(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost
) -> None:
    snapshot = t4.scan()
    plugins.refresh(snapshot)
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    groups = {v.uuid: v.iommu_group for g in snapshot.gpus for v in g.vgpus}
    response = kubelet.allocate(T4_4Q, [U2, U1], [U1])
    first, second = response.container_responses
    assert dict(first.envs) == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-4Q": f"{U2},{U1}"}
    assert [(d.host_path, d.container_path, d.permissions) for d in first.devices] == [
        ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"),
        (f"/dev/vfio/{groups[U2]}", f"/dev/vfio/{groups[U2]}", "mrw"),
        (f"/dev/vfio/{groups[U1]}", f"/dev/vfio/{groups[U1]}", "mrw"),
    ]
    assert dict(second.envs) == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-4Q": U1}


def test_allocate_of_vendor_vfio_vfs_with_iommufd(
    kubelet: DevicePluginKubelet, plugin_dir: Path
) -> None:
    m = manager(plugin_dir, iommufd=True)
    try:
        with SimHost(SIM / "l40s-pair.yaml") as host:
            snapshot = host.scan()
            m.refresh(snapshot)
            resource = "nvidia.com/NVIDIA_L40S-4Q"
            seen = kubelet.wait_for(resource, lambda d: len(d) == 2)
            assert ids(seen) == ["0000:26:00.4", "0000:26:00.7"]
            vf = next(v for g in snapshot.gpus for v in g.vgpus if v.parent == "0000:26:00.7")
            got = kubelet.allocate(resource, ["0000:26:00.7"]).container_responses[0]
            assert dict(got.envs) == {"PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-4Q": "0000:26:00.7"}
            assert [d.host_path for d in got.devices] == [
                "/dev/vfio/vfio",
                f"/dev/vfio/{vf.iommu_group}",
                "/dev/iommu",
                f"/dev/vfio/devices/{vf.vfio_cdev}",
            ]
    finally:
        m.stop()


def test_allocate_of_an_unknown_id_is_an_error_naming_it(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    with pytest.raises(grpc.RpcError) as info:
        kubelet.allocate(T4_4Q, [U1, U3])
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert U3 in info.value.details() and U1 not in info.value.details()


def test_device_vanishing_outside_an_apply_turns_unhealthy(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    t4.remove_mdev(U1)  # no refresh: not an apply of ours
    seen = kubelet.wait_for(T4_4Q, lambda d: any(x.health == "Unhealthy" for x in d))
    assert {(d.id, d.health) for d in seen} == {(U1, "Unhealthy"), (U2, "Healthy")}
    t4.create_mdev("0000:3b:00.0", 232, U1)
    kubelet.wait_for(T4_4Q, lambda d: {x.health for x in d} == {"Healthy"})


def test_stop_sends_empty_lists_first(
    kubelet: DevicePluginKubelet, plugin_dir: Path, t4: SimHost
) -> None:
    m = manager(plugin_dir)
    t4.create_mdev("0000:af:00.0", 233, U3)
    m.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    kubelet.wait_for(T4_8Q, lambda d: len(d) == 1)
    m.stop()
    for resource in (T4_4Q, T4_8Q):  # sent before stop() returned; the kubelet reads it now
        assert kubelet.wait_for(resource, lambda d: d == ()) == ()
    assert not [p for p in os.listdir(plugin_dir) if p.startswith("vgpu-state-")]


def test_registration_retries_until_the_kubelet_accepts(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost
) -> None:
    kubelet.reject_registrations = 2
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2, timeout=3)
    assert kubelet.reject_registrations == 0 and len(kubelet.registrations) == 1


def test_a_new_kubelet_socket_gets_quick_retries_before_the_backoff(
    kubelet: DevicePluginKubelet, plugin_dir: Path, t4: SimHost
) -> None:
    kubelet.reject_registrations = 2  # e.g. a kubelet still starting behind its socket
    m = manager(plugin_dir, backoff=Backoff(30.0, 30.0))
    try:
        m.refresh(t4.scan())
        kubelet.wait_for(T4_4Q, lambda d: len(d) == 2, timeout=5)
    finally:
        m.stop()


def test_plugin_waits_for_a_kubelet_that_starts_later(plugin_dir: Path, t4: SimHost) -> None:
    m = manager(plugin_dir, backoff=Backoff(30.0, 30.0))
    try:
        m.refresh(t4.scan())
        time.sleep(0.2)
        assert not m.status()[T4_4Q].registered
        with DevicePluginKubelet(
            str(plugin_dir)
        ) as k:  # kubelet.sock appears: no 30 s backoff wait
            k.wait_for(T4_4Q, lambda d: len(d) == 2, timeout=2)
    finally:
        m.stop()


def test_illegal_resource_name_is_reported_not_registered(
    kubelet: DevicePluginKubelet, plugin_dir: Path
) -> None:
    # A node built in memory: no sysfs to check device health against.
    plugins = manager(plugin_dir, present=lambda d: True)
    odd = Vgpu(kind="mdev", parent="0000:01:00.0", uuid=U1, type_name="4Q (beta)", iommu_group=7)
    good = Vgpu(kind="mdev", parent="0000:01:00.0", uuid=U2, type_sysfs_name="NVIDIA A2-4Q")
    gpu = Gpu(
        index=0, address="0000:01:00.0", vendor_id=0x10DE, device_id=0x25B6, numa_node=-1,
        layout=SysfsInterface.MDEV, vgpus=(odd, good),
    )  # fmt: skip
    plugins.refresh(NodeSnapshot(node="n", gpus=(gpu,)))
    seen = kubelet.wait_for("nvidia.com/NVIDIA_A2-4Q", lambda d: len(d) == 1)
    assert seen == (SeenDevice(U2, "Healthy", ()),)  # NUMA -1: no topology
    assert list(plugins.status()) == ["nvidia.com/NVIDIA_A2-4Q"]
    assert len(plugins.problems) == 1 and "'4Q (beta)'" in plugins.problems[0]
    plugins.stop()


def test_many_open_streams_do_not_starve_allocate(
    kubelet: DevicePluginKubelet, plugins: DevicePluginManager, t4: SimHost, plugin_dir: Path
) -> None:
    plugins.refresh(t4.scan())
    kubelet.wait_for(T4_4Q, lambda d: len(d) == 2)
    socket = f"unix:{plugin_dir}/vgpu-state-nvidia.com_GRID_T4-4Q.sock"
    channels = [grpc.insecure_channel(socket) for _ in range(12)]
    try:
        streams = [pb_grpc.DevicePluginStub(c).ListAndWatch(pb.Empty()) for c in channels]
        for s in streams[-1:]:
            assert len(next(s).devices) == 2
        stub = pb_grpc.DevicePluginStub(channels[0])
        for _ in range(5):
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=2)
            assert options.get_preferred_allocation_available
        response = kubelet.allocate(T4_4Q, [U1])
        assert dict(response.container_responses[0].envs)
    finally:
        for c in channels:
            c.close()
