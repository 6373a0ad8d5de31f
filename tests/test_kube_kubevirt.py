"""The KubeVirt CR: entries from a scanned node, guarded writes, ownership, foreign writers.

Everything here goes through the official ``kubernetes`` client to the real API
server (``tests/realcluster.py``) with a KubeVirt CRD built from KubeVirt's
OpenAPI schema, as the agent (its ServiceAccount's token, under the shipped
RBAC); conflicts and failed JSON Patch ``test`` ops are the server's own. One
test keeps kmock's emulator: it needs a server that refuses one particular entry
(fault injection).
"""

from __future__ import annotations

import copy
import json
import random
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import KUBEVIRT, RunningApiServer
from tests.realcluster import ControlPlane
from vgpu_state.kube import kubevirt
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterConflictError, ClusterError
from vgpu_state.kube.kubevirt import (
    OWNERSHIP_ANNOTATION,
    Backoff,
    KubeVirtRef,
    PermittedEntry,
    blockers,
    desired_entries,
)
from vgpu_state.sim.host import SimHost

REF = KubeVirtRef("kubevirt", "kubevirt")
FOREIGN_PCI = {"pciVendorSelector": "10DE:1EB8", "resourceName": "nvidia.com/TU104GL_TESLA_T4"}
FOREIGN_MDEV = {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q"}
SNEAKY = {"mdevNameSelector": "SNEAKY", "resourceName": "example.com/sneaky"}


def _cr(configuration: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"certificateRotateStrategy": {}, "workloadUpdateStrategy": {}}
    if configuration is not None:
        spec["configuration"] = configuration
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "spec": spec}


@pytest.fixture
def api(cluster: ControlPlane, tmp_path: Path) -> KubeApi:
    """The API as an agent sees it (its ServiceAccount's token)."""
    token = cluster.agent_token("gpu-node-1")
    return KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)))


def _mixed(sim_spec_paths: list[Path]) -> SimHost:
    return SimHost(next(p for p in sim_spec_paths if p.name == "mixed.yaml"), in_memory=True)


def test_entries_come_from_the_live_vgpu_types_with_sysfs_names(
    sim_spec_paths: list[Path],
) -> None:
    desired = desired_entries(_mixed(sim_spec_paths).scan())
    assert [e.to_json() for e in desired.entries] == [
        {
            "mdevNameSelector": "GRID T4-8C",
            "resourceName": "nvidia.com/GRID_T4-8C",
            "externalResourceProvider": True,
        },
        {
            "mdevNameSelector": "NVIDIA A2-4C",
            "resourceName": "nvidia.com/NVIDIA_A2-4C",
            "externalResourceProvider": True,
        },
        {
            "mdevNameSelector": "NVIDIA A2-4Q",
            "resourceName": "nvidia.com/NVIDIA_A2-4Q",
            "externalResourceProvider": True,
        },
        {
            # The L40S VF's own device id, read from sysfs.
            "pciVendorSelector": "10DE:26B9",
            "resourceName": "nvidia.com/NVIDIA_L40S-12Q",
            "externalResourceProvider": True,
        },
    ]
    assert desired.problems == ()


def test_the_scan_reads_the_vf_device_id(sim_spec_paths: list[Path]) -> None:
    snapshot = _mixed(sim_spec_paths).scan()
    l40s = snapshot.gpu("0000:81:00.0")
    assert l40s is not None
    assert {vf.device_id for vf in l40s.vfs} == {0x26B9}


def test_add_keeps_foreign_entries_in_place_and_records_ownership(
    cluster: ControlPlane, api: KubeApi, sim_spec_paths: list[Path]
) -> None:
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr(
            {
                "permittedHostDevices": {
                    "pciHostDevices": [FOREIGN_PCI],
                    "mediatedDevices": [FOREIGN_MDEV],
                }
            }
        ),
        namespace="kubevirt",
    )
    desired = desired_entries(_mixed(sim_spec_paths).scan())
    result = kubevirt.sync(api, REF, desired.entries)
    assert [c.describe(REF) for c in result.changes] == [
        "+ kubevirt[kubevirt/kubevirt].mediatedDevices[GRID T4-8C]",
        "+ kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A2-4C]",
        "+ kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A2-4Q]",
        "+ kubevirt[kubevirt/kubevirt].pciHostDevices[nvidia.com/NVIDIA_L40S-12Q]",
    ]
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    devices = cr["spec"]["configuration"]["permittedHostDevices"]
    assert devices["mediatedDevices"][0] == FOREIGN_MDEV
    assert devices["pciHostDevices"][0] == FOREIGN_PCI
    assert [d["resourceName"] for d in devices["mediatedDevices"][1:]] == [
        "nvidia.com/GRID_T4-8C",
        "nvidia.com/NVIDIA_A2-4C",
        "nvidia.com/NVIDIA_A2-4Q",
    ]
    assert json.loads(cr["metadata"]["annotations"][OWNERSHIP_ANNOTATION]) == sorted(
        desired.resources
    )
    # A second sync finds nothing to do and writes nothing.
    writes = cluster.counts["PATCH"]
    again = kubevirt.sync(api, REF, desired.entries)
    assert again.changes == ()
    assert cluster.counts["PATCH"] == writes


def test_a_cr_without_configuration_gets_the_containers(
    cluster: ControlPlane, api: KubeApi
) -> None:
    cluster.put(KUBEVIRT, "kubevirt", _cr(), namespace="kubevirt")
    entry = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")
    kubevirt.sync(api, REF, [entry])
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"] == {
        "mediatedDevices": [entry.to_json()]
    }
    assert cr["spec"]["certificateRotateStrategy"] == {}


def test_foreign_entry_for_our_resource_is_left_alone(cluster: ControlPlane, api: KubeApi) -> None:
    theirs = {"mdevNameSelector": "nvidia-745", "resourceName": "nvidia.com/NVIDIA_A2-4Q"}
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": [theirs]}}),
        namespace="kubevirt",
    )
    entry = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")
    result = kubevirt.sync(api, REF, [entry], keep=lambda: frozenset())
    assert result.changes == ()
    assert result.foreign == ("nvidia.com/NVIDIA_A2-4Q",)
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [theirs]


def test_remove_only_owned_entries_that_nobody_advertises(
    cluster: ControlPlane, api: KubeApi
) -> None:
    a2 = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")
    t4 = PermittedEntry("mediatedDevices", "nvidia.com/GRID_T4-8C", "GRID T4-8C")
    l40 = PermittedEntry("pciHostDevices", "nvidia.com/NVIDIA_L40S-12Q", "10DE:26B9")
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
        namespace="kubevirt",
    )
    kubevirt.sync(api, REF, [a2, t4, l40])
    # Without the duty to remove (keep=None) nothing goes, whatever the node has.
    assert kubevirt.sync(api, REF, []).changes == ()
    # T4-8C is still advertised by another node; A2-4Q and the L40S type by none.
    result = kubevirt.sync(
        api, REF, [], keep=lambda: frozenset({t4.resource, FOREIGN_MDEV["resourceName"]})
    )
    assert sorted(c.describe(REF) for c in result.changes) == [
        "- kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A2-4Q]",
        "- kubevirt[kubevirt/kubevirt].pciHostDevices[nvidia.com/NVIDIA_L40S-12Q]",
    ]
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    devices = cr["spec"]["configuration"]["permittedHostDevices"]
    assert devices["mediatedDevices"] == [FOREIGN_MDEV, t4.to_json()]
    assert devices["pciHostDevices"] == []
    assert json.loads(cr["metadata"]["annotations"][OWNERSHIP_ANNOTATION]) == [t4.resource]
    # The foreign entry is never removed, even when nothing advertises it.
    kubevirt.sync(api, REF, [], keep=lambda: frozenset())
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [FOREIGN_MDEV]


def test_concurrent_foreign_writer_loses_nothing(
    cluster: ControlPlane, api: KubeApi, tmp_path: Path
) -> None:
    """Another controller appends to the same atomic lists while vgpu-state adds its entries."""
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": []}}),
        namespace="kubevirt",
    )
    other = KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "other")))
    foreign = [
        {"mdevNameSelector": f"FOREIGN {i}", "resourceName": f"example.com/foreign-{i}"}
        for i in range(15)
    ]

    def foreign_writer() -> None:
        for item in foreign:
            for _ in range(200):
                cr = other.get(REF.path)
                items = copy.deepcopy(
                    cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
                )
                items.append(item)
                try:
                    other.replace(REF.path, _with_list(cr, items))  # PUT with resourceVersion
                    break
                except ClusterError:
                    continue

    ours = [
        PermittedEntry("mediatedDevices", f"nvidia.com/NVIDIA_A2-{n}Q", f"NVIDIA A2-{n}Q")
        for n in (1, 2, 4, 8, 16)
    ]
    writer = threading.Thread(target=foreign_writer)
    writer.start()
    conflicts = 0
    for entry in ours:
        conflicts += kubevirt.sync(
            api, REF, [entry], backoff=Backoff(base=0.001, cap=0.01)
        ).conflicts
    writer.join(60)
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    names = [
        i["resourceName"]
        for i in cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    ]
    assert sorted(names) == sorted(
        [e.resource for e in ours] + [f["resourceName"] for f in foreign]
    )
    # The foreign entries kept their relative order.
    assert [n for n in names if n.startswith("example.com")] == [f["resourceName"] for f in foreign]


def _with_list(cr: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    new = copy.deepcopy(cr)
    new["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] = items
    return new


def test_a_lost_race_is_retried_with_backoff(cluster: ControlPlane, api: KubeApi) -> None:
    """Between our read and our write another writer changes the list: 422, re-read, retry."""
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
        namespace="kubevirt",
    )
    sneaky = {"mdevNameSelector": "SNEAKY", "resourceName": "example.com/sneaky"}
    sleeps: list[float] = []
    real_get = api.get
    raced = {"done": False}

    def get_then_race(path: str) -> dict[str, Any]:
        obj = real_get(path)
        if not raced["done"]:
            raced["done"] = True
            cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
            assert cr is not None
            cluster.put(
                KUBEVIRT, "kubevirt", _with_list(cr, [FOREIGN_MDEV, sneaky]), namespace="kubevirt"
            )
        return obj

    api.get = get_then_race  # type: ignore[method-assign]
    entry = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")
    result = kubevirt.sync(api, REF, [entry], rng=random.Random(1), sleep=sleeps.append)
    assert result.conflicts == 1 and result.attempts == 2
    assert len(sleeps) == 1 and 0 <= sleeps[0] <= Backoff().base
    assert cluster.counts["422"] == 1
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [
        FOREIGN_MDEV,
        sneaky,
        entry.to_json(),
    ]


def test_single_cr_is_found_or_named(cluster: ControlPlane, api: KubeApi) -> None:
    with pytest.raises(ClusterError, match="no KubeVirt CR found"):
        kubevirt.find(api, None)
    cluster.put(KUBEVIRT, "kubevirt", _cr(), namespace="kubevirt")
    assert kubevirt.find(api, None) == REF
    if cluster.get("v1/namespaces", "other") is None:
        cluster.write("v1/namespaces", "other", {})
    cluster.put(KUBEVIRT, "kv2", _cr(), namespace="other")
    with pytest.raises(ClusterError, match=r"2 KubeVirt CRs found .*NAMESPACE/NAME"):
        kubevirt.find(api, None)
    assert kubevirt.find(api, KubeVirtRef.parse("other/kv2")) == KubeVirtRef("other", "kv2")
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        KubeVirtRef.parse("kubevirt")


@pytest.mark.parametrize(
    ("mdev_config", "gates", "labels", "blocked"),
    [
        ({"mediatedDeviceTypes": ["nvidia-745"]}, [], {}, True),
        ({"mediatedDevicesTypes": ["nvidia-745"]}, [], {}, True),
        ({"mediatedDeviceTypes": ["nvidia-745"]}, ["DisableMDEVConfiguration"], {}, False),
        ({"mediatedDeviceTypes": ["nvidia-745"], "enabled": False}, [], {}, False),
        # enabled: true wins over the deprecated gate.
        (
            {"mediatedDeviceTypes": ["nvidia-745"], "enabled": True},
            ["DisableMDEVConfiguration"],
            {},
            True,
        ),
        ({}, [], {}, False),
        ({"enabled": True}, [], {}, False),
        (
            {
                "nodeMediatedDeviceTypes": [
                    {"nodeSelector": {"gpu": "a2"}, "mediatedDeviceTypes": ["A2-4Q"]}
                ]
            },
            [],
            {"gpu": "a2"},
            True,
        ),
        (
            {
                "nodeMediatedDeviceTypes": [
                    {"nodeSelector": {"gpu": "a2"}, "mediatedDeviceTypes": ["A2-4Q"]}
                ]
            },
            [],
            {"gpu": "t4"},
            False,
        ),
    ],
)
def test_kubevirt_mdev_management_is_a_blocker(
    mdev_config: dict[str, Any],
    gates: list[str],
    labels: dict[str, str],
    blocked: bool,
    sim_spec_paths: list[Path],
) -> None:
    cr = _cr(
        {
            "mediatedDevicesConfiguration": mdev_config,
            "developerConfiguration": {"featureGates": gates},
        }
    )
    kubevirt_validator_check(cr)
    found = blockers(cr, labels, _mixed(sim_spec_paths).scan())
    assert bool(found) is blocked
    if blocked:
        assert found[0].reason == "KubeVirtMdevManagementActive"
        assert "mediatedDevicesConfiguration.enabled: false" in found[0].message
        assert "DisableMDEVConfiguration" in found[0].message


def test_nodes_without_mdev_gpus_are_not_blocked(sim_spec_paths: list[Path]) -> None:
    host = SimHost(next(p for p in sim_spec_paths if p.name == "l40s-pair.yaml"), in_memory=True)
    cr = _cr({"mediatedDevicesConfiguration": {"mediatedDeviceTypes": ["nvidia-745"]}})
    assert blockers(cr, {}, host.scan()) == ()


def kubevirt_validator_check(cr: dict[str, Any]) -> None:
    from tests.apiserver import kubevirt_validator

    kubevirt_validator()(cr)


# many nodes at once: requests on the CR ---------------------------------------------
def _mdev(n: int) -> PermittedEntry:
    return PermittedEntry("mediatedDevices", f"nvidia.com/NVIDIA_A16-{n}Q", f"NVIDIA A16-{n}Q")


def _pci(n: int) -> PermittedEntry:
    return PermittedEntry("pciHostDevices", f"nvidia.com/NVIDIA_L40S-{n}Q", "10DE:26B9")


def _requests(cr: dict[str, Any]) -> dict[str, str]:
    annotations = cr["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith(kubevirt.PENDING_PREFIX)}


def test_many_nodes_adding_distinct_types_at_once_each_land_exactly_once(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """Every node adds a type no other node has, all at the same moment, each with its own
    client: every entry lands once, the foreign ones stay first and unchanged, and no
    request is left on the CR."""
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr(
            {
                "permittedHostDevices": {
                    "mediatedDevices": [FOREIGN_MDEV],
                    "pciHostDevices": [FOREIGN_PCI],
                }
            }
        ),
        namespace="kubevirt",
    )
    nodes = 24
    token = cluster.agent_token("gpu-node-1")
    config = str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token))
    barrier = threading.Barrier(nodes)
    results: dict[int, kubevirt.SyncResult] = {}
    failures: list[str] = []

    def node(i: int) -> None:
        client = KubeApi.connect(config, pool_size=1)
        entry = _mdev(i) if i % 2 == 0 else _pci(i)
        barrier.wait()
        try:
            results[i] = kubevirt.sync(
                client, REF, [entry], node=f"node-{i}", backoff=Backoff(base=0.005, cap=0.05)
            )
        except ClusterError as e:
            failures.append(f"node-{i}: {e}")

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == [] and len(results) == nodes

    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    devices = cr["spec"]["configuration"]["permittedHostDevices"]
    assert devices["mediatedDevices"][0] == FOREIGN_MDEV
    assert devices["pciHostDevices"][0] == FOREIGN_PCI
    mdev = [e["resourceName"] for e in devices["mediatedDevices"][1:]]
    pci = [e["resourceName"] for e in devices["pciHostDevices"][1:]]
    assert sorted(mdev) == sorted(_mdev(i).resource for i in range(0, nodes, 2))
    assert sorted(pci) == sorted(_pci(i).resource for i in range(1, nodes, 2))
    assert all(e["externalResourceProvider"] is True for e in devices["mediatedDevices"][1:])
    owned = json.loads(cr["metadata"]["annotations"][OWNERSHIP_ANNOTATION])
    assert owned == sorted(mdev + pci)
    assert _requests(cr) == {}
    # Whoever lost a race and left a request was served by some accepted write.
    if any(r.requested for r in results.values()):
        assert any(r.served for r in results.values())


def test_a_write_adds_what_other_nodes_requested_and_removes_their_requests(
    cluster: ControlPlane, api: KubeApi
) -> None:
    a16 = _mdev(4)
    requested_mdev, requested_pci = _mdev(2), _pci(12)
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        {
            **_cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
            "metadata": {
                "annotations": {
                    "example.com/other": "kept",
                    kubevirt.pending_key("node-b"): kubevirt.encode_request([requested_mdev]),
                    kubevirt.pending_key("node-c"): kubevirt.encode_request([requested_pci, a16]),
                    # Not something vgpu-state writes: dropped, never copied into the CR.
                    kubevirt.pending_key("node-d"): '[["mediatedDevices", "", "x"], "junk"]',
                    # Already permitted by an entry vgpu-state does not own: left alone.
                    kubevirt.pending_key("node-e"): json.dumps(
                        [["mediatedDevices", FOREIGN_MDEV["resourceName"], "OTHER"]]
                    ),
                }
            },
        },
        namespace="kubevirt",
    )
    patches = cluster.counts["PATCH"]
    result = kubevirt.sync(api, REF, [a16], node="node-a")
    assert cluster.counts["PATCH"] == patches + 1, "one write serves every request"
    assert [c.describe(REF) for c in result.own_changes] == [
        "+ kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A16-4Q]"
    ]
    assert sorted(c.describe(REF) for c in result.changes if c.requested_by) == [
        "+ kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A16-2Q] (requested by node-b)",
        "+ kubevirt[kubevirt/kubevirt].pciHostDevices[nvidia.com/NVIDIA_L40S-12Q]"
        " (requested by node-c)",
    ]
    assert sorted(result.served) == [
        kubevirt.pending_key(n) for n in ("node-b", "node-c", "node-d", "node-e")
    ]
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    devices = cr["spec"]["configuration"]["permittedHostDevices"]
    assert devices["mediatedDevices"] == [
        FOREIGN_MDEV,
        a16.to_json(),
        requested_mdev.to_json(),
    ]
    assert devices["pciHostDevices"] == [requested_pci.to_json()]
    assert json.loads(cr["metadata"]["annotations"][OWNERSHIP_ANNOTATION]) == sorted(
        [a16.resource, requested_mdev.resource, requested_pci.resource]
    )
    assert _requests(cr) == {}
    assert cr["metadata"]["annotations"]["example.com/other"] == "kept"

    # node-b finds its entry there: it reads, and writes nothing.
    again = kubevirt.sync(api, REF, [requested_mdev], node="node-b")
    assert again.changes == () and again.attempts == 1
    assert cluster.counts["PATCH"] == patches + 1


def test_a_node_that_loses_a_race_leaves_a_request_and_the_winner_adds_it(
    cluster: ControlPlane, api: KubeApi, tmp_path: Path
) -> None:
    """node-a reads, node-b writes first; node-a's guarded write is refused, it leaves its
    entry as a request and backs off; node-b's next write adds it; node-a then finds it."""
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
        namespace="kubevirt",
    )
    other = KubeApi.connect(
        str(cluster.write_kubeconfig(tmp_path / "node-b", token=cluster.agent_token("node-b")))
    )
    mine, theirs, later = _mdev(1), _mdev(2), _pci(3)
    real_get = api.get
    raced = {"done": False}

    def get_then_race(path: str) -> dict[str, Any]:
        obj = real_get(path)
        if not raced["done"]:
            raced["done"] = True
            kubevirt.sync(other, REF, [theirs], node="node-b")
        return obj

    seen_requests: list[dict[str, str]] = []
    served: list[kubevirt.SyncResult] = []

    def backoff_while_node_b_writes(delay: float) -> None:
        cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
        assert cr is not None
        seen_requests.append(_requests(cr))
        served.append(kubevirt.sync(other, REF, [theirs, later], node="node-b"))

    api.get = get_then_race  # type: ignore[method-assign]
    result = kubevirt.sync(
        api, REF, [mine], node="node-a", rng=random.Random(1), sleep=backoff_while_node_b_writes
    )
    assert seen_requests == [{kubevirt.pending_key("node-a"): kubevirt.encode_request([mine])}]
    assert result.conflicts == 1 and result.requested == 1 and result.attempts == 2
    assert result.changes == (), "node-a's entry was added by node-b's write"
    assert served[0].served == (kubevirt.pending_key("node-a"),)
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    devices = cr["spec"]["configuration"]["permittedHostDevices"]
    assert devices["mediatedDevices"] == [FOREIGN_MDEV, theirs.to_json(), mine.to_json()]
    assert devices["pciHostDevices"] == [later.to_json()]
    assert _requests(cr) == {}


def test_a_node_that_gives_up_says_so_and_its_request_is_added_by_the_next_writer(
    cluster: ControlPlane, api: KubeApi, tmp_path: Path
) -> None:
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        {
            **_cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
            "metadata": {"annotations": {"example.com/other": "kept"}},
        },
        namespace="kubevirt",
    )
    real_get = api.get
    foreign_added = iter(range(100))

    def get_then_foreign_write(path: str) -> dict[str, Any]:
        obj = real_get(path)
        # Another controller appends an entry after every read of ours.
        cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
        assert cr is not None
        items = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        n = next(foreign_added)
        extra = {"mdevNameSelector": f"OTHER {n}", "resourceName": f"example.com/other-{n}"}
        cluster.put(KUBEVIRT, "kubevirt", _with_list(cr, [*items, extra]), namespace="kubevirt")
        return obj

    api.get = get_then_foreign_write  # type: ignore[method-assign]
    mine = _pci(8)
    with pytest.raises(ClusterConflictError) as failed:
        kubevirt.sync(
            api, REF, [mine], node="node-a", backoff=Backoff(attempts=3), sleep=lambda _: None
        )
    message = str(failed.value)
    assert "3 concurrent changes in a row" in message
    assert "entries are not all in it yet" in message
    assert kubevirt.pending_key("node-a") in message
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert "pciHostDevices" not in cr["spec"]["configuration"]["permittedHostDevices"]
    assert _requests(cr) == {kubevirt.pending_key("node-a"): kubevirt.encode_request([mine])}
    foreign_names = [
        e["resourceName"]
        for e in cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    ]

    # The next node to write adds node-a's entry; the foreign entries keep their order.
    other = KubeApi.connect(
        str(cluster.write_kubeconfig(tmp_path / "node-b", token=cluster.agent_token("node-b")))
    )
    result = kubevirt.sync(other, REF, [_mdev(1)], node="node-b")
    assert result.served == (kubevirt.pending_key("node-a"),)
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    devices = cr["spec"]["configuration"]["permittedHostDevices"]
    assert devices["pciHostDevices"] == [mine.to_json()]
    assert [e["resourceName"] for e in devices["mediatedDevices"]] == [
        *foreign_names,
        _mdev(1).resource,
    ]
    assert _requests(cr) == {}


def test_the_lease_holder_keeps_requested_entries_and_adds_the_rest(
    cluster: ControlPlane, api: KubeApi
) -> None:
    """A request proves a node has the type now, even before its status says so."""
    requested, added, gone = _mdev(1), _pci(2), _mdev(3)
    kubevirt_cr = _cr(
        {"permittedHostDevices": {"mediatedDevices": [requested.to_json(), gone.to_json()]}}
    )
    kubevirt_cr["metadata"] = {
        "annotations": {
            OWNERSHIP_ANNOTATION: json.dumps(sorted([requested.resource, gone.resource])),
            kubevirt.pending_key("node-x"): kubevirt.encode_request([requested, added]),
        }
    }
    cluster.put(KUBEVIRT, "kubevirt", kubevirt_cr, namespace="kubevirt")
    result = kubevirt.sync(api, REF, [], keep=lambda: frozenset(), node="holder")
    assert sorted(c.describe(REF) for c in result.changes) == [
        "+ kubevirt[kubevirt/kubevirt].pciHostDevices[nvidia.com/NVIDIA_L40S-2Q]"
        " (requested by node-x)",
        "- kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A16-3Q]",
    ]
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    devices = cr["spec"]["configuration"]["permittedHostDevices"]
    assert devices == {
        "mediatedDevices": [requested.to_json()],
        "pciHostDevices": [added.to_json()],
    }
    assert _requests(cr) == {}


def test_request_keys_are_valid_annotation_names_for_any_node_name() -> None:
    short = "gpu-node-7.example.com"
    assert kubevirt.pending_key(short) == "pending.vgpu-state.io/gpu-node-7.example.com"
    long_a = "a" * 45 + "." + "b" * 100
    long_b = "a" * 45 + "." + "c" * 100
    keys = {kubevirt.pending_key(n) for n in (long_a, long_b)}
    assert len(keys) == 2
    for key in keys:
        prefix, _, name = key.partition("/")
        assert prefix == "pending.vgpu-state.io"
        assert len(name) <= 63
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name)


def test_without_annotations_on_the_cr_a_losing_node_retries_on_its_own(
    cluster: ControlPlane, api: KubeApi
) -> None:
    """A request needs the CR's annotation map; the API server refuses to create it
    unguarded, so the node says plainly that its entries are not in the CR."""
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
        namespace="kubevirt",
    )
    real_get = api.get
    counter = iter(range(100))

    def get_then_foreign_write(path: str) -> dict[str, Any]:
        obj = real_get(path)
        cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
        assert cr is not None
        n = next(counter)
        extra = {"mdevNameSelector": f"OTHER {n}", "resourceName": f"example.com/other-{n}"}
        items = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        cluster.put(KUBEVIRT, "kubevirt", _with_list(cr, [*items, extra]), namespace="kubevirt")
        return obj

    api.get = get_then_foreign_write  # type: ignore[method-assign]
    with pytest.raises(ClusterConflictError) as failed:
        kubevirt.sync(
            api, REF, [_mdev(1)], node="node-a", backoff=Backoff(attempts=2), sleep=lambda _: None
        )
    assert str(failed.value).endswith("this node's entries are not all in it yet")
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert "annotations" not in cr["metadata"] or _requests(cr) == {}
    assert _mdev(1).resource not in json.dumps(cr["spec"])


def test_a_request_that_would_overflow_the_annotations_is_refused_and_the_node_retries_alone(
    cluster: ControlPlane, api: KubeApi
) -> None:
    """The API server limits an object's annotations to 256 KiB in all; a request that
    does not fit is refused, and the node still gets its entry in by itself."""
    from tests.apiserver import ANNOTATIONS_LIMIT

    owned = json.dumps([_mdev(1).resource])
    filler = "x" * (ANNOTATIONS_LIMIT - len("example.com/big") - len(OWNERSHIP_ANNOTATION) - 60)
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        {
            **_cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
            "metadata": {"annotations": {"example.com/big": filler, OWNERSHIP_ANNOTATION: "[]"}},
        },
        namespace="kubevirt",
    )
    real_get = api.get
    raced = {"done": False}

    def get_then_race(path: str) -> dict[str, Any]:
        obj = real_get(path)
        if not raced["done"]:
            raced["done"] = True
            cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
            assert cr is not None
            cluster.put(
                KUBEVIRT,
                "kubevirt",
                _with_list(cr, [FOREIGN_MDEV, SNEAKY]),
                namespace="kubevirt",
            )
        return obj

    api.get = get_then_race  # type: ignore[method-assign]
    result = kubevirt.sync(api, REF, [_mdev(1)], node="node-a", sleep=lambda _: None)
    assert result.conflicts == 1 and result.requested == 0 and result.attempts == 2
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [
        FOREIGN_MDEV,
        SNEAKY,
        _mdev(1).to_json(),
    ]
    assert cr["metadata"]["annotations"][OWNERSHIP_ANNOTATION] == owned
    assert _requests(cr) == {}


def test_requests_that_vgpu_state_would_not_write_are_dropped() -> None:
    good = _pci(4)
    value = json.dumps(
        [
            ["pciHostDevices", good.resource, good.selector],
            ["pciHostDevices", "nvidia.com/NVIDIA_L4-4Q", "10de:27b8; rm"],
            ["pciHostDevices", "no-domain", "10DE:27B8"],
            ["mediatedDevices", "nvidia.com/A", " padded "],
            ["mediatedDevices", "nvidia.com/B", "x" * 129],
            ["otherList", "nvidia.com/C", "C"],
            ["mediatedDevices", "kubernetes.io/D", "D"],
        ]
    )
    assert kubevirt.decode_request(value) == (good,)
    assert kubevirt.decode_request("{not json") == ()
    assert kubevirt.decode_request('{"a": 1}') == ()


def test_a_node_whose_entries_are_in_leaves_unsettled_requests_to_others(
    cluster: ControlPlane, api: KubeApi
) -> None:
    """Settling other nodes' requests is a courtesy: when that write loses a race, a node
    whose own entries the CR already holds is done, not failed."""
    mine, theirs = _mdev(1), _mdev(2)
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        {
            **_cr({"permittedHostDevices": {"mediatedDevices": [mine.to_json()]}}),
            "metadata": {
                "annotations": {
                    OWNERSHIP_ANNOTATION: json.dumps([mine.resource]),
                    kubevirt.pending_key("node-b"): kubevirt.encode_request([theirs]),
                }
            },
        },
        namespace="kubevirt",
    )
    real_get = api.get

    def get_then_race(path: str) -> dict[str, Any]:
        obj = real_get(path)
        cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
        assert cr is not None
        items = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        cluster.put(KUBEVIRT, "kubevirt", _with_list(cr, [*items, SNEAKY]), namespace="kubevirt")
        return obj

    api.get = get_then_race  # type: ignore[method-assign]
    result = kubevirt.sync(api, REF, [mine], node="node-a", sleep=lambda _: None)
    assert result.conflicts == 1 and result.attempts == 1 and result.changes == ()
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert _requests(cr) == {kubevirt.pending_key("node-b"): kubevirt.encode_request([theirs])}


def test_a_request_the_api_server_refuses_does_not_stop_a_node_adding_its_own(
    apiserver: RunningApiServer, tmp_path: Path
) -> None:
    """If a write carrying another node's request is refused although nothing changed
    (say an admission check dislikes that entry), the node writes its own entries alone.

    On kmock's emulator: a server that refuses one particular entry (fault injection)."""
    from tests.apiserver import kubevirt_validator

    api = KubeApi.connect(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))

    poison = PermittedEntry("mediatedDevices", "nvidia.com/POISON", "POISON")
    schema = kubevirt_validator()

    def refuse_poison(obj: dict[str, Any]) -> None:
        if "nvidia.com/POISON" in json.dumps(obj.get("spec")):
            raise ValueError("POISON is not allowed here")
        schema(obj)

    apiserver.set_validator(KUBEVIRT, refuse_poison)
    apiserver.put(
        KUBEVIRT,
        "kubevirt",
        {
            **_cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
            "metadata": {
                "annotations": {kubevirt.pending_key("node-b"): kubevirt.encode_request([poison])}
            },
        },
        namespace="kubevirt",
    )
    mine = _mdev(1)
    result = kubevirt.sync(api, REF, [mine], node="node-a", sleep=lambda _: None)
    assert result.conflicts == 1 and result.attempts == 2
    assert [c.describe(REF) for c in result.changes] == [
        "+ kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A16-1Q]"
    ]
    cr = apiserver.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [
        FOREIGN_MDEV,
        mine.to_json(),
    ]
    assert list(_requests(cr)) == [kubevirt.pending_key("node-b")]
    assert len(apiserver.rejected) == 1 and "POISON" in apiserver.rejected[0]
    apiserver.rejected.clear()  # the one refusal this test provoked


def test_a_node_that_loses_to_a_node_adding_the_same_type_writes_no_request(
    cluster: ControlPlane, api: KubeApi, tmp_path: Path
) -> None:
    """In a fleet most nodes share their types: the node that lost finds its entry added
    by the winner, and neither asks for it nor writes again."""
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
        namespace="kubevirt",
    )
    other = KubeApi.connect(
        str(cluster.write_kubeconfig(tmp_path / "node-b", token=cluster.agent_token("node-b")))
    )
    shared = _mdev(4)
    real_get = api.get
    raced = {"done": False}

    def get_then_race(path: str) -> dict[str, Any]:
        obj = real_get(path)
        if not raced["done"]:
            raced["done"] = True
            kubevirt.sync(other, REF, [shared], node="node-b")
        return obj

    api.get = get_then_race  # type: ignore[method-assign]
    patches = cluster.counts["PATCH"] + cluster.counts["422"]
    result = kubevirt.sync(api, REF, [shared], node="node-a", sleep=lambda _: None)
    assert result.conflicts == 1 and result.requested == 0 and result.changes == ()
    # node-b's write and node-a's refused one; no request, no second write.
    assert cluster.counts["PATCH"] + cluster.counts["422"] == patches + 2
    cr = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [
        FOREIGN_MDEV,
        shared.to_json(),
    ]
    assert _requests(cr) == {}
