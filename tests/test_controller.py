"""The cluster controller: the KubeVirt CR's permitted devices from every node's status.

The pure parts, on values: which entries a report justifies, the grace period,
unreadable and refused statuses, and the one guarded patch a decision makes. The loop
(leader election between replicas, one guarded write per change counted in the API
server's audit log, no second decode of an unchanged status) runs against the real
kube-apiserver as the controller's ServiceAccount: ``tests/test_controller_real.py``.
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from typing import Any

from vgpu_state.catalog import default_catalog
from vgpu_state.controller.bounds import LayoutBounds
from vgpu_state.controller.desired import Missing, decide
from vgpu_state.controller.reports import NodeReport, checked_entries, read_report
from vgpu_state.kube import nodestate
from vgpu_state.kube.nodestate import VGPUNodeStateStatus, encode_snapshot
from vgpu_state.kube.permitted import OWNERSHIP_ANNOTATION, desired_entries
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.host import SimHost

T0 = datetime.datetime(2026, 11, 24, 10, 0, tzinfo=datetime.UTC)
FOREIGN = {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q"}
GRACE = 300.0
BOUNDS = LayoutBounds(
    frozenset({"A2-4A", "A2-4C", "A2-4Q", "T4-8C", "L40S-12Q", "A40-48Q"}), default_catalog()
)
"""A layouts document naming the simulated hosts' types (and one no GPU here offers)."""


def _scan(sim_spec_paths: list[Path], name: str, node: str) -> NodeSnapshot:
    host = SimHost(next(p for p in sim_spec_paths if p.name == name), in_memory=True)
    return host.scan().model_copy(update={"node": node})


def _state(node: str, snapshot: NodeSnapshot | None) -> dict[str, Any]:
    status = VGPUNodeStateStatus(
        snapshot=encode_snapshot(snapshot, T0) if snapshot is not None else None
    )
    return {
        "apiVersion": nodestate.API_VERSION,
        "kind": nodestate.KIND,
        "metadata": {"name": node},
        "spec": {"nodeName": node},
        "status": status.to_json(),
    }


def _cr(
    owned: list[str] | None = None, mdevs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    cr: dict[str, Any] = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "7"},
        "spec": {
            "configuration": {"permittedHostDevices": {"mediatedDevices": mdevs or [FOREIGN]}}
        },
    }
    if owned is not None:
        cr["metadata"]["annotations"] = {OWNERSHIP_ANNOTATION: json.dumps(sorted(owned))}
    return cr


def _applied(cr: dict[str, Any], decision_patch: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    import jsonpatch

    return dict(jsonpatch.apply_patch(copy.deepcopy(cr), list(decision_patch)))


# which entries a report justifies ---------------------------------------------------
def test_entries_come_from_the_checked_scan_of_the_node(sim_spec_paths: list[Path]) -> None:
    snapshot = _scan(sim_spec_paths, "mixed.yaml", "gpu-1")
    report = read_report(_state("gpu-1", snapshot), BOUNDS)
    assert report.unreadable is None and report.refused is None
    assert report.entries == desired_entries(snapshot).entries
    assert not report.skipped and not report.outside


def test_a_nic_or_a_type_the_driver_does_not_list_has_no_way_into_the_cr(
    sim_spec_paths: list[Path],
) -> None:
    """A report is a claim: an Intel NIC (8086:1572) dressed as a GPU with a VF "vGPU", or
    an mdev whose type the GPU's driver never listed, yields no entry."""
    snapshot = _scan(sim_spec_paths, "mixed.yaml", "gpu-1")
    l40s = next(g for g in snapshot.gpus if g.model == "L40S")
    nic = l40s.model_copy(update={"vendor_id": 0x8086, "device_id": 0x1572})
    a2 = next(g for g in snapshot.gpus if g.model and "A2" in g.model and g.vgpus)
    odd = a2.vgpus[0].model_copy(
        update={"type_sysfs_name": "i915-GVTg_V5_4", "type_name": "GVTg_V5_4"}
    )
    unlisted = a2.vgpus[0].model_copy(
        update={"type_sysfs_name": "NVIDIA A40-48Q", "type_name": "A40-48Q", "type_id": 999}
    )
    forged_a2 = a2.model_copy(update={"vgpus": (odd, unlisted)})
    forged = snapshot.model_copy(
        update={
            "gpus": tuple(nic if g is l40s else forged_a2 if g is a2 else g for g in snapshot.gpus)
        }
    )
    checked = checked_entries(forged, BOUNDS)
    entries, skipped = checked.entries, checked.outside.first
    resources = {e.resource for e in entries}
    assert all(e.selector.startswith("10DE:") for e in entries if e.list == "pciHostDevices")
    assert not any("1572" in e.selector for e in entries)
    assert "nvidia.com/NVIDIA_L40S-12Q" not in resources  # only the NIC carried it
    assert "nvidia.com/NVIDIA_A40-48Q" not in resources
    assert not any("GVTg" in r for r in resources)
    assert any("vendor 8086 is not NVIDIA" in s for s in skipped)
    assert any("is not an NVIDIA vGPU type name" in s for s in skipped)
    assert any("is not one the GPU's driver lists" in s for s in skipped)


def test_a_scan_of_another_node_or_with_repeated_addresses_is_refused(
    sim_spec_paths: list[Path],
) -> None:
    theirs = _scan(sim_spec_paths, "mixed.yaml", "gpu-2")
    refused = read_report(_state("gpu-1", theirs), BOUNDS)
    assert refused.entries == () and "scan is of node 'gpu-2'" in (refused.refused or "")
    mine = _scan(sim_spec_paths, "mixed.yaml", "gpu-1")
    copied = mine.model_copy(update={"gpus": mine.gpus + mine.gpus})
    repeated = read_report(_state("gpu-1", copied), BOUNDS)
    assert repeated.entries == () and "repeats PCI addresses" in (repeated.refused or "")


def test_a_newer_agents_status_is_read_for_what_this_version_knows(
    sim_spec_paths: list[Path],
) -> None:
    """A rolling upgrade: unknown fields (at the top, in a condition, inside the scan) and
    an unknown condition type are ignored, never a reason to drop the node's entries."""
    import base64
    import gzip

    snapshot = _scan(sim_spec_paths, "mixed.yaml", "gpu-1")
    obj = _state("gpu-1", snapshot)
    raw = json.loads(snapshot.model_dump_json(exclude_defaults=True))
    raw["gpus"][0]["futureField"] = {"x": 1}
    raw["schemaHint"] = 2
    data = base64.b64encode(gzip.compress(json.dumps(raw).encode(), mtime=0)).decode()
    obj["status"]["snapshot"]["data"] = data
    obj["status"]["snapshot"]["compression"] = "gzip"
    obj["status"]["newTopLevel"] = {"a": 1}
    obj["status"]["conditions"] = [
        {
            "type": "Synced",
            "status": "True",
            "reason": "Synced",
            "lastTransitionTime": "2026-11-24T10:00:00Z",
            "severity": "Info",
        },
        {
            "type": "HostFirmwareCurrent",
            "status": "True",
            "reason": "Current",
            "lastTransitionTime": "2026-11-24T10:00:00Z",
        },
    ]
    report = read_report(obj, BOUNDS)
    assert report.unreadable is None, report.unreadable
    assert report.entries == desired_entries(snapshot).entries
    status = nodestate.status_of(obj)
    assert status is not None and [c.type for c in status.conditions] == ["Synced"]


# the grace period -----------------------------------------------------------------
def _report(node: str, *resources: str) -> NodeReport:
    from vgpu_state.kube.permitted import PermittedEntry

    return NodeReport(
        node,
        tuple(
            PermittedEntry("mediatedDevices", f"nvidia.com/{r.replace(' ', '_')}", r)
            for r in resources
        ),
    )


def test_an_entry_goes_only_after_no_node_reported_it_for_the_grace_period() -> None:
    """The race: a node's status briefly lacks a type it has (written before, read after);
    the entry stays through the grace period and goes only once nobody reports it."""
    a2 = "nvidia.com/NVIDIA_A2-4Q"
    cr = _cr(
        [a2],
        [
            FOREIGN,
            {
                "mdevNameSelector": "NVIDIA A2-4Q",
                "resourceName": a2,
                "externalResourceProvider": True,
            },
        ],
    )
    d = decide(cr, [_report("gpu-1")], Missing(), now=0.0, grace=GRACE)
    assert d.plan.patch == () and d.waiting == ((a2, GRACE),)
    d = decide(cr, [_report("gpu-1")], d.missing, now=GRACE - 1, grace=GRACE)
    assert d.plan.patch == ()
    # Reported again: the clock stops; missing again later: it starts afresh.
    d = decide(cr, [_report("gpu-1", "NVIDIA A2-4Q")], d.missing, now=GRACE, grace=GRACE)
    assert d.plan.patch == () and d.missing.since == {}
    d = decide(cr, [_report("gpu-1")], d.missing, now=GRACE + 10, grace=GRACE)
    assert d.plan.patch == ()
    d = decide(cr, [_report("gpu-1")], d.missing, now=2 * GRACE + 10, grace=GRACE)
    assert [c.describe("kubevirt/kubevirt") for c in d.plan.changes] == [
        "- kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A2-4Q]"
    ]
    after = _applied(cr, d.plan.patch)
    assert after["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [FOREIGN]


def test_an_unreadable_status_suspends_every_removal() -> None:
    a2 = "nvidia.com/NVIDIA_A2-4Q"
    cr = _cr(
        [a2],
        [
            FOREIGN,
            {
                "mdevNameSelector": "NVIDIA A2-4Q",
                "resourceName": a2,
                "externalResourceProvider": True,
            },
        ],
    )
    broken = NodeReport("gpu-2", unreadable="its scan cannot be read: bad gzip")
    d = decide(cr, [_report("gpu-1"), broken], Missing({a2: 0.0}), now=10 * GRACE, grace=GRACE)
    assert d.plan.patch == ()
    assert d.held is not None and "gpu-2" in d.held
    # A refused report (another node's scan) stops nothing and adds nothing.
    liar = NodeReport("gpu-3", refused="its scan is of node 'gpu-1', not 'gpu-3'")
    d = decide(cr, [_report("gpu-1"), liar], Missing({a2: 0.0}), now=10 * GRACE, grace=GRACE)
    assert [c.op for c in d.plan.changes] == ["remove"]
    assert d.refused == ("gpu-3: its scan is of node 'gpu-1', not 'gpu-3'",)


def test_one_guarded_patch_adds_every_nodes_entries() -> None:
    cr = _cr([])
    reports = [_report("gpu-2", "NVIDIA A2-4Q", "GRID T4-8C"), _report("gpu-1", "NVIDIA A2-4Q")]
    d = decide(cr, reports, Missing(), now=0.0, grace=GRACE)
    ops = [op["op"] for op in d.plan.patch]
    assert ops.count("test") >= 1 and ops.count("replace") >= 1
    after = _applied(cr, d.plan.patch)
    names = [
        e["resourceName"]
        for e in after["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    ]
    # New entries follow the foreign one in resource-name order, whoever reported them.
    assert names == ["nvidia.com/GRID_T4-1Q", "nvidia.com/GRID_T4-8C", "nvidia.com/NVIDIA_A2-4Q"]
    assert decide(after, reports, d.missing, now=1.0, grace=GRACE).plan.patch == ()
