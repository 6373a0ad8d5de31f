"""The kubelet DRA plugin, driven by a fake kubelet over real gRPC on unix sockets.

The host is a simulated node rendered as a sysfs tree (IOMMU groups, VFIO
cdevs); claims come from memory, written as the scheduler would allocate them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.dra.claims import AllocatedDevice, Claim, Consumer
from vgpu_state.dra.plugin import DraPlugin
from vgpu_state.dra.prepare import DraPaths, Preparer
from vgpu_state.dra.slices import DRIVER, PoolSpec, build_pool
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import MemoryClaims, dra_paths
from vgpu_state.testing.dra_kubelet import DraKubelet

CATALOG = default_catalog()

MIXED = Path(__file__).resolve().parent.parent / "configs" / "sim" / "mixed.yaml"
NODE = "gpu-node-1"
T4_MDEV = "mdev-9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"
L40S_VF = "vf-0000-81-00-6"


@dataclass
class Rig:
    host: SimHost
    pool: PoolSpec
    paths: DraPaths
    claims: MemoryClaims
    plugin: DraPlugin
    kubelet: DraKubelet

    def group(self, sysfs_path: str) -> str:
        return Path(self.host.root, sysfs_path, "iommu_group").resolve().name

    def restart(self) -> None:
        """Stop the plugin and start a new one on the same directories (a node agent restart)."""
        self.kubelet.close()
        self.plugin.stop()
        preparer = Preparer(
            node=NODE, claims=self.claims, inventory=lambda: self.pool.devices, paths=self.paths
        )
        self.plugin = DraPlugin(preparer, self.paths)
        self.plugin.start()
        self.kubelet.register_all()


def claim(name: str, uid: str, *devices: tuple[str, str], template: str | None = None) -> Claim:
    return Claim(
        namespace="vms",
        name=name,
        uid=uid,
        annotations={"resource.kubernetes.io/pod-claim-name": template} if template else {},
        allocated=True,
        results=tuple(
            AllocatedDevice(request=r, driver=DRIVER, pool=NODE, device=d) for r, d in devices
        ),
        reserved_for=(Consumer(resource="pods", name=f"virt-launcher-{name}", uid="p-" + uid),),
    )


@pytest.fixture
def rig() -> Iterator[Rig]:
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # unix socket paths stay short
    host = SimHost(MIXED)
    pool = build_pool(host.scan(), catalog=CATALOG)
    paths = dra_paths(base, host.root)
    claims = MemoryClaims()
    preparer = Preparer(node=NODE, claims=claims, inventory=lambda: pool.devices, paths=paths)
    plugin = DraPlugin(preparer, paths)
    plugin.start()
    kubelet = DraKubelet(paths.registry_dir)
    r = Rig(host, pool, paths, claims, plugin, kubelet)
    try:
        yield r
    finally:
        r.kubelet.close()
        r.plugin.stop()
        host.close()
        shutil.rmtree(base, ignore_errors=True)


def _spec(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_kubelet_registers_the_plugin_through_the_registration_socket(rig: Rig) -> None:
    assert (rig.paths.registry_dir / f"{DRIVER}-reg.sock").exists()
    assert rig.kubelet.register_all() == [DRIVER]
    registered = rig.kubelet.plugins[DRIVER]
    assert registered.endpoint == str(rig.paths.plugin_dir / "dra.sock")
    assert registered.version == "v1.DRAPlugin"
    assert rig.plugin.registered.wait(2)


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_prepare_writes_cdi_specs_and_metadata_and_unprepare_removes_them(
    rig: Rig, version: str
) -> None:
    rig.kubelet.versions = (version,)
    rig.kubelet.register_all()
    assert rig.kubelet.plugins[DRIVER].version == version
    uid = "0b4cf1a2-0000-4000-8000-000000000001"
    rig.claims.put(claim("win-gpu", uid, ("gpu", T4_MDEV)))

    reply = rig.kubelet.prepare(DRIVER, [("vms", "win-gpu", uid)])
    result = reply.claims[uid]
    assert result.error == ""
    (device,) = result.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["gpu"],
        NODE,
        T4_MDEV,
    )
    cdi_id, meta_id = device.cdi_device_ids
    assert cdi_id == f"{DRIVER}/vgpu={uid}-{T4_MDEV}"
    assert meta_id == f"{DRIVER}/metadata={uid}_gpu"

    # The device spec: named after the claim, giving the VFIO nodes of the mdev's IOMMU group.
    spec_path = rig.paths.cdi_dir / f"{DRIVER}_{uid}.json"
    spec = _spec(spec_path)
    assert spec["kind"] == f"{DRIVER}/vgpu"
    (dev,) = spec["devices"]  # type: ignore[misc]
    assert dev["name"] == cdi_id.split("=", 1)[1]
    group = rig.group(f"bus/mdev/devices/{T4_MDEV[5:]}")
    assert dev["containerEdits"]["deviceNodes"] == [{"path": f"/dev/vfio/{group}"}]
    assert spec["containerEdits"] == {"deviceNodes": [{"path": "/dev/vfio/vfio"}]}

    # The metadata KubeVirt reads, and the spec that mounts it where the pod looks.
    meta_spec = _spec(rig.paths.cdi_dir / f"{DRIVER}_metadata_{uid}_gpu.json")
    assert meta_spec["kind"] == f"{DRIVER}/metadata"
    (mdev,) = meta_spec["devices"]  # type: ignore[misc]
    assert mdev["name"] == meta_id.split("=", 1)[1]
    (mount,) = mdev["containerEdits"]["mounts"]
    assert mount["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/win-gpu/gpu/"
        f"{DRIVER}-metadata.json"
    )
    assert "ro" in mount["options"]
    meta = json.loads(Path(mount["hostPath"]).read_text())
    assert meta["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
    assert meta["kind"] == "DeviceMetadata"
    assert meta["metadata"] == {"name": "win-gpu", "namespace": "vms", "uid": uid, "generation": 1}
    (req,) = meta["requests"]
    assert req["name"] == "gpu"
    (mdevice,) = req["devices"]
    assert mdevice["attributes"]["mdevUUID"] == {"string": T4_MDEV[5:]}
    assert (mdevice["driver"], mdevice["pool"], mdevice["name"]) == (DRIVER, NODE, T4_MDEV)

    # Prepare again (the kubelet retries): same answer, nothing new written.
    before = sorted(p.name for p in rig.paths.cdi_dir.iterdir())
    again = rig.kubelet.prepare(DRIVER, [("vms", "win-gpu", uid)]).claims[uid]
    assert list(again.devices[0].cdi_device_ids) == [cdi_id, meta_id]
    assert sorted(p.name for p in rig.paths.cdi_dir.iterdir()) == before

    for _ in range(2):  # unprepare is idempotent too
        out = rig.kubelet.unprepare(DRIVER, [("vms", "win-gpu", uid)])
        assert out.claims[uid].error == ""
    assert list(rig.paths.cdi_dir.iterdir()) == []
    assert not Path(mount["hostPath"]).exists()
    assert rig.plugin.preparer.prepared() == {}


def test_a_vf_vgpu_gets_its_group_and_iommufd_nodes_and_template_claims_their_path(
    rig: Rig,
) -> None:
    (rig.paths.dev_root).mkdir(parents=True)
    (rig.paths.dev_root / "iommu").touch()  # this host has iommufd
    rig.kubelet.register_all()
    uid = "0b4cf1a2-0000-4000-8000-000000000002"
    rig.claims.put(claim("render-gpu-x7k2p", uid, ("vgpu", L40S_VF), template="gpu"))
    result = rig.kubelet.prepare(DRIVER, [("vms", "render-gpu-x7k2p", uid)]).claims[uid]
    assert result.error == ""
    spec = _spec(rig.paths.cdi_dir / f"{DRIVER}_{uid}.json")
    (dev,) = spec["devices"]  # type: ignore[misc]
    group = rig.group("bus/pci/devices/0000:81:00.6")
    cdev = next(Path(rig.host.root, "bus/pci/devices/0000:81:00.6/vfio-dev").iterdir()).name
    assert dev["containerEdits"]["deviceNodes"] == [
        {"path": f"/dev/vfio/{group}"},
        {"path": "/dev/iommu"},
        {"path": f"/dev/vfio/devices/{cdev}"},
    ]
    meta_spec = _spec(rig.paths.cdi_dir / f"{DRIVER}_metadata_{uid}_vgpu.json")
    (mount,) = meta_spec["devices"][0]["containerEdits"]["mounts"]  # type: ignore[index]
    assert mount["containerPath"].startswith(
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/vgpu/"
    )
    meta = json.loads(Path(mount["hostPath"]).read_text())
    assert meta["podClaimName"] == "gpu"
    attributes = meta["requests"][0]["devices"][0]["attributes"]
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:81:00.6"}
    assert "mdevUUID" not in attributes


def test_unprepare_works_after_a_restart_when_the_claim_is_gone(rig: Rig) -> None:
    rig.kubelet.register_all()
    uid = "0b4cf1a2-0000-4000-8000-000000000003"
    rig.claims.put(claim("two", uid, ("a", T4_MDEV), ("b", L40S_VF)))
    result = rig.kubelet.prepare(DRIVER, [("vms", "two", uid)]).claims[uid]
    assert [d.device_name for d in result.devices] == [T4_MDEV, L40S_VF]
    assert len(list(rig.paths.cdi_dir.iterdir())) == 3  # devices + one metadata spec per request

    rig.claims.claims.clear()  # the claim is deleted while the node agent restarts
    rig.restart()
    assert rig.plugin.preparer.prepared() == {uid: (T4_MDEV, L40S_VF)}
    assert rig.kubelet.unprepare(DRIVER, [("vms", "two", uid)]).claims[uid].error == ""
    assert list(rig.paths.cdi_dir.iterdir()) == []
    assert not any(rig.paths.metadata_dir.iterdir())


def test_prepare_refuses_what_it_cannot_give_and_answers_for_every_claim(rig: Rig) -> None:
    rig.kubelet.register_all()
    ok, missing, foreign, taken, wrong_uid = (
        f"0b4cf1a2-0000-4000-8000-00000000001{i}" for i in range(5)
    )
    rig.claims.put(claim("ok", ok, ("gpu", T4_MDEV)))
    rig.claims.put(claim("foreign", foreign, ("gpu", "mdev-00000000-0000-0000-0000-000000000009")))
    rig.claims.put(claim("taken", taken, ("gpu", T4_MDEV)))
    rig.claims.put(claim("wrong-uid", "someone-else", ("gpu", L40S_VF)))
    reply = rig.kubelet.prepare(
        DRIVER,
        [
            ("vms", "ok", ok),
            ("vms", "missing", missing),
            ("vms", "foreign", foreign),
            ("vms", "taken", taken),
            ("vms", "wrong-uid", wrong_uid),
        ],
    )
    assert set(reply.claims) == {ok, missing, foreign, taken, wrong_uid}
    assert reply.claims[ok].error == ""
    assert "vms/missing not found" in reply.claims[missing].error
    assert "not offered for DRA" in reply.claims[foreign].error
    assert f"already prepared for claim UID {ok}" in reply.claims[taken].error
    assert "has UID someone-else" in reply.claims[wrong_uid].error
    assert sorted(p.name for p in rig.paths.cdi_dir.iterdir()) == sorted(
        [f"{DRIVER}_{ok}.json", f"{DRIVER}_metadata_{ok}_gpu.json"]
    )


def test_stopping_removes_the_sockets(rig: Rig) -> None:
    rig.plugin.stop()
    assert not (rig.paths.registry_dir / f"{DRIVER}-reg.sock").exists()
    assert not rig.paths.socket.exists()


def test_a_first_available_claim_answers_with_the_top_level_request(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """``gpu/l40s`` was allocated; the kubelet matches containers against ``gpu``. The
    metadata document keeps upstream's ``gpu/l40s``, which KubeVirt 1.9 cannot look up:
    the agent warns, naming the claim."""
    rig.kubelet.register_all()
    uid = "0b4cf1a2-0000-4000-8000-000000000020"
    rig.claims.put(claim("fa", uid, ("gpu/l40s", L40S_VF)))
    (device,) = rig.kubelet.prepare(DRIVER, [("vms", "fa", uid)]).claims[uid].devices
    assert list(device.request_names) == ["gpu"]
    assert device.cdi_device_ids[1] == f"{DRIVER}/metadata={uid}_gpu"
    meta_spec = _spec(rig.paths.cdi_dir / f"{DRIVER}_metadata_{uid}_gpu.json")
    (mount,) = meta_spec["devices"][0]["containerEdits"]["mounts"]  # type: ignore[index]
    assert mount["containerPath"] == (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/fa/gpu/{DRIVER}-metadata.json"
    )
    meta = json.loads(Path(mount["hostPath"]).read_text())
    assert Path(mount["hostPath"]).parent.name == "gpu"
    assert meta["requests"][0]["name"] == "gpu/l40s"  # only the document keeps the full name
    assert meta["metadata"]["generation"] == 1
    assert (
        "ResourceClaim vms/fa: request gpu/l40s was allocated through firstAvailable; "
        "KubeVirt 1.9 and older look its device up as 'gpu'" in caplog.text
    )


def test_kubevirt_problem_names_the_claim_shapes_kubevirt_cannot_use() -> None:
    from vgpu_state.dra.prepare import kubevirt_problem

    assert kubevirt_problem("c", ["gpu"]) is None
    assert kubevirt_problem("c", ["gpu1", "gpu2"]) is None
    assert "firstAvailable" in (kubevirt_problem("c", ["gpu/l40s"]) or "")
    assert "allocated 2 devices" in (kubevirt_problem("c", ["gpu", "gpu"]) or "")


def test_a_rewritten_metadata_file_gets_the_next_generation(rig: Rig) -> None:
    """Prepared, then the checkpoint lost before it was saved: prepare writes the file again."""
    rig.kubelet.register_all()
    uid = "0b4cf1a2-0000-4000-8000-000000000021"
    rig.claims.put(claim("gen", uid, ("gpu", T4_MDEV)))
    rig.kubelet.prepare(DRIVER, [("vms", "gen", uid)])
    host = rig.plugin.preparer.claim_metadata_dir(uid) / "gpu" / "metadata.json"
    assert json.loads(host.read_text())["metadata"]["generation"] == 1
    rig.paths.checkpoint.unlink()
    rig.restart()
    assert rig.kubelet.prepare(DRIVER, [("vms", "gen", uid)]).claims[uid].error == ""
    assert json.loads(host.read_text())["metadata"]["generation"] == 2


def _two_claims(rig: Rig) -> tuple[str, str, list[str]]:
    rig.kubelet.register_all()
    a, b = "0b4cf1a2-0000-4000-8000-000000000030", "0b4cf1a2-0000-4000-8000-000000000031"
    rig.claims.put(claim("one", a, ("gpu", T4_MDEV)))
    rig.claims.put(claim("two", b, ("gpu", L40S_VF)))
    reply = rig.kubelet.prepare(DRIVER, [("vms", "one", a), ("vms", "two", b)])
    assert [reply.claims[u].error for u in (a, b)] == ["", ""]
    files = sorted(str(p) for p in rig.paths.plugin_dir.parent.parent.rglob("*") if p.is_file())
    return a, b, files


def _files(rig: Rig) -> list[str]:
    return sorted(str(p) for p in rig.paths.plugin_dir.parent.parent.rglob("*") if p.is_file())


@pytest.mark.parametrize("hostile", ["*", "../two", "", ".", "a/b", "[0-9]*"])
def test_a_claim_uid_that_is_no_uid_is_refused_and_deletes_nothing(rig: Rig, hostile: str) -> None:
    a, b, files = _two_claims(rig)
    out = rig.kubelet.unprepare(DRIVER, [("vms", "one", hostile)]).claims[hostile]
    assert "is not a Kubernetes UID" in out.error
    prep = rig.kubelet.prepare(DRIVER, [("vms", "one", hostile)]).claims[hostile]
    assert "is not a Kubernetes UID" in prep.error
    assert _files(rig) == files
    assert set(rig.plugin.preparer.prepared()) == {a, b}


def test_unpreparing_a_uid_never_prepared_leaves_a_claim_of_the_same_name_alone(
    rig: Rig,
) -> None:
    """A claim deleted and created again under the same name has a new UID; the kubelet's
    late unprepare of the old UID must not take the new claim's metadata."""
    a, _, files = _two_claims(rig)
    stale = "0b4cf1a2-0000-4000-8000-0000000000ff"
    assert rig.kubelet.unprepare(DRIVER, [("vms", "one", stale)]).claims[stale].error == ""
    assert _files(rig) == files
    meta = rig.plugin.preparer.claim_metadata_dir(a) / "gpu" / "metadata.json"
    assert json.loads(meta.read_text())["metadata"]["uid"] == a


_OK_ENTRY = {"namespace": "vms", "name": "x", "devices": [], "files": []}


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"u-1": {"namespace": "vms", "name": "x", "files": []}},
         "claim 'u-1': missing key 'devices'"),
        ({"u-1": ["not", "a", "mapping"]}, "claim 'u-1': entry is a list, not a mapping"),
        ({"u-1": {**_OK_ENTRY, "name": 3}}, "'name' is not a string"),
        ({"u-1": {**_OK_ENTRY, "devices": [{"request": "gpu"}]}}, "missing key 'pool'"),
        ({"*": _OK_ENTRY}, "is not a Kubernetes UID"),
        (["u-1"], "'claims' is not a mapping"),
    ],
)  # fmt: skip
def test_a_checkpoint_of_the_wrong_shape_is_a_clear_error(
    rig: Rig, claims: object, expected: str
) -> None:
    from vgpu_state.dra.prepare import CheckpointError

    rig.paths.checkpoint.write_text(json.dumps({"version": 1, "claims": claims}))
    with pytest.raises(CheckpointError) as err:
        Preparer(node=NODE, claims=rig.claims, inventory=lambda: rig.pool.devices, paths=rig.paths)
    message = str(err.value)
    assert str(rig.paths.checkpoint) in message and expected in message
    assert "move it aside" in message
