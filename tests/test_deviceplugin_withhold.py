"""``DevicePluginManager.withhold``: what a kubelet is told while vGPUs are withheld.

Runs the plugin's gRPC servers against :class:`DevicePluginKubelet` (a stand-in
kubelet on unix sockets that records every list; no Go needed).
``tests/test_withhold_kubelet.py`` checks the same against the kubelet's own
device manager.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import grpc
import pytest

from tests.builders import V, build_gpu, build_snapshot
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

A = "0000:08:00.0"
B = "0000:41:00.0"
Q4 = "nvidia.com/A2-4Q"
Q2 = "nvidia.com/A2-2Q"


def node(extra_2q: bool = False) -> NodeSnapshot:
    return build_snapshot(
        build_gpu(A, "A2", vgpus=[V("A2-4Q", 0), V("A2-4Q", 1)]),
        build_gpu(B, "A2", vgpus=[V("A2-2Q", 0), *([V("A2-2Q", 1)] if extra_2q else [])]),
    )


def keys(snapshot: NodeSnapshot, gpu: str) -> list[str]:
    found = snapshot.gpu(gpu)
    assert found is not None
    return [v.key for v in found.vgpus]


@pytest.fixture
def kubelet() -> Iterator[tuple[DevicePluginKubelet, DevicePluginManager]]:
    with tempfile.TemporaryDirectory(prefix="dpw-", dir="/tmp") as d:
        k = DevicePluginKubelet(d)
        k.start()
        manager = DevicePluginManager(
            d, present=lambda device: True, poll_interval=0.02, iommufd=False
        )
        try:
            yield k, manager
        finally:
            manager.stop()
            k.stop()


def ids(k: DevicePluginKubelet, resource: str) -> set[str]:
    return {d.id for d in k.devices(resource) or ()}


def test_withheld_devices_leave_the_list_are_refused_and_come_back(
    kubelet: tuple[DevicePluginKubelet, DevicePluginManager],
) -> None:
    k, manager = kubelet
    snapshot = node()
    first, second = keys(snapshot, A)
    manager.refresh(snapshot)
    k.wait_registered(Q4)
    k.wait_for(Q4, lambda seen: len(seen) == 2)

    manager.withhold(frozenset({first}))
    k.wait_for(Q4, lambda seen: {d.id for d in seen} == {second})
    assert manager.advertised()[Q4] == 1
    assert manager.status()[Q4].withheld == (first,)
    with pytest.raises(grpc.RpcError) as refused:
        k.allocate(Q4, [first])
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"{first} are withheld" in str(refused.value.details())
    assert k.preferred(Q4, [first, second], [], 1) == [second]

    # Every device of a resource withheld: it stays registered with an empty list.
    manager.withhold(frozenset({first, second}))
    k.wait_for(Q4, lambda seen: seen == ())
    assert manager.advertised()[Q4] == 0

    manager.withhold(frozenset())
    k.wait_for(Q4, lambda seen: len(seen) == 2)
    assert manager.advertised() == {Q4: 2, Q2: 1}


def test_the_set_applies_to_resources_that_appear_later_and_survives_a_refresh(
    kubelet: tuple[DevicePluginKubelet, DevicePluginManager],
) -> None:
    k, manager = kubelet
    grown = node(extra_2q=True)
    later = keys(grown, B)[1]
    first = keys(grown, A)[0]
    manager.withhold(frozenset({first, later}))  # before any refresh: remembered
    manager.refresh(node())
    k.wait_registered(Q4)
    k.wait_for(Q4, lambda seen: first not in {d.id for d in seen} and len(seen) == 1)
    manager.refresh(grown)  # a new vGPU that is withheld is never listed
    k.wait_for(Q2, lambda seen: len(seen) == 1)
    assert later not in ids(k, Q2)
    assert ids(k, Q4) == {keys(grown, A)[1]}
    updates = k.updates(Q4)
    manager.withhold(frozenset({first, later}))  # the same set: nothing is sent again
    assert k.updates(Q4) == updates
