"""The KubeVirt CR: entries from a scanned node, guarded writes, ownership, foreign writers.

Everything here goes through the official ``kubernetes`` client to the real API
server (``tests/realcluster.py``) with a KubeVirt CRD built from KubeVirt's
OpenAPI schema, as the cluster controller (its ServiceAccount's token, under
the shipped RBAC: the only vgpu-state identity that may write the CR);
conflicts and failed JSON Patch ``test`` ops are the server's own.
"""

from __future__ import annotations

import copy
import json
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import KUBEVIRT
from tests.realcluster import CONTROLLER_USER, WRITE_VERBS, ControlPlane
from vgpu_state.background import Backoff
from vgpu_state.kube import kubevirt, permitted
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterError
from vgpu_state.kube.guardedpatch import PatchCheckError
from vgpu_state.kube.kubevirt import (
    OWNERSHIP_ANNOTATION,
    WRITE_BACKOFF,
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


def sync(
    api: KubeApi,
    ref: KubeVirtRef,
    entries: list[PermittedEntry] | tuple[PermittedEntry, ...],
    keep: Callable[[], frozenset[str]] | None = None,
    **options: Any,
) -> kubevirt.WriteResult:
    """One guarded write of ``entries`` (and removals outside ``keep()``), as the controller
    makes it."""
    return kubevirt.write(
        api, ref, lambda cr: kubevirt.plan_write(cr, entries, keep() if keep else None), **options
    )


def _cr(configuration: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"certificateRotateStrategy": {}, "workloadUpdateStrategy": {}}
    if configuration is not None:
        spec["configuration"] = configuration
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "spec": spec}


@pytest.fixture
def api(cluster: ControlPlane, tmp_path: Path) -> KubeApi:
    """The API as the controller sees it (its ServiceAccount's token, bound to its pod)."""
    return KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "kubeconfig")))


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
    result = sync(api, REF, desired.entries)
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
    again = sync(api, REF, desired.entries)
    assert again.changes == ()
    assert cluster.counts["PATCH"] == writes


def test_a_cr_without_configuration_gets_the_containers(
    cluster: ControlPlane, api: KubeApi
) -> None:
    cluster.put(KUBEVIRT, "kubevirt", _cr(), namespace="kubevirt")
    entry = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")
    sync(api, REF, [entry])
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
    result = sync(api, REF, [entry], keep=lambda: frozenset())
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
    sync(api, REF, [a2, t4, l40])
    # Without the duty to remove (keep=None) nothing goes, whatever the node has.
    assert sync(api, REF, []).changes == ()
    # T4-8C is still advertised by another node; A2-4Q and the L40S type by none.
    result = sync(api, REF, [], keep=lambda: frozenset({t4.resource, FOREIGN_MDEV["resourceName"]}))
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
    sync(api, REF, [], keep=lambda: frozenset())
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
        conflicts += sync(
            api, REF, [entry], backoff=Backoff(0.001, 0.01), attempts=40
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
    result = sync(api, REF, [entry], rng=random.Random(1), sleep=sleeps.append)
    assert result.conflicts == 1 and result.attempts == 2
    assert len(sleeps) == 1 and sleeps[0] == WRITE_BACKOFF.base
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


def _drop_the_list(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [op for op in ops if op["op"] != "replace" or "mediatedDevices" not in op["path"]]


def _misspell_the_list(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**op, "path": op["path"].replace("mediatedDevices", "mediatedDevice")} for op in ops]


def _drop_the_last_op(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return ops[:-1]


@pytest.mark.parametrize(
    "breaking", [_drop_the_list, _misspell_the_list, _drop_the_last_op], ids=lambda f: f.__name__
)
def test_a_patch_that_would_not_give_the_wanted_cr_is_never_sent(
    cluster: ControlPlane,
    api: KubeApi,
    monkeypatch: pytest.MonkeyPatch,
    breaking: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> None:
    """A fault in the patch builder (an op dropped, a wrong path) is found by applying the
    patch to the CR read before it is sent: a clear error naming the CR, and no request
    reaches the API server (its audit log shows no write of the controller's token)."""
    cluster.put(
        KUBEVIRT,
        "kubevirt",
        _cr({"permittedHostDevices": {"mediatedDevices": [FOREIGN_MDEV]}}),
        namespace="kubevirt",
    )
    before = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    real = permitted._patch

    def broken(cr: Any, wanted: Any, *, fence: str | None) -> list[dict[str, Any]]:
        return breaking(real(cr, wanted, fence=fence))

    monkeypatch.setattr(permitted, "_patch", broken)
    mark = cluster.audit_mark()
    entry = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")
    with pytest.raises(PatchCheckError) as refused:
        sync(api, REF, [entry])
    assert str(refused.value).startswith("KubeVirt CR kubevirt/kubevirt: the JSON Patch")
    assert "nothing was sent" in str(refused.value)
    writes = [e for e in cluster.audit(mark, CONTROLLER_USER) if e.get("verb") in WRITE_VERBS]
    assert writes == []
    assert [e.get("verb") for e in cluster.audit(mark, CONTROLLER_USER)] == ["get"]
    assert cluster.get(KUBEVIRT, "kubevirt", "kubevirt") == before
    # The builder as shipped: the same write goes through.
    monkeypatch.undo()
    assert sync(api, REF, [entry]).writes == 1
