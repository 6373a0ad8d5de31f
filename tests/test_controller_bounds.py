"""What one node's report can make the controller permit: only what the admin's layouts
document can produce on the node's GPU model, of the kind and selector the catalog gives,
settled by the majority where nodes disagree (pure: the decision on values).

The same attacks against the real API server, as a node agent's pod-bound token:
``tests/test_controller_hostile_real.py``.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from tests.hostile_reports import LAYOUT_TYPES, layouts, made_up_types, scan, vf_backed_a2
from tests.hostile_status import encode_snapshot_unbounded
from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text
from vgpu_state.controller.bounds import LayoutBounds
from vgpu_state.controller.desired import Missing, decide, wanted_entries
from vgpu_state.controller.reports import NodeReport, checked_entries, read_report
from vgpu_state.kube import nodestate
from vgpu_state.kube.nodestate import VGPUNodeStateStatus, encode_snapshot
from vgpu_state.kube.permitted import OWNERSHIP_ANNOTATION, PermittedEntry, blockers
from vgpu_state.model.snapshot import NodeSnapshot, SysfsInterface

T0 = datetime.datetime(2026, 11, 24, 10, 0, tzinfo=datetime.UTC)
GRACE = 300.0
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
MDEV = PermittedEntry("mediatedDevices", A2_4Q, "NVIDIA A2-4Q")
VF = PermittedEntry("pciHostDevices", A2_4Q, "10DE:25B6")


@pytest.fixture(scope="module")
def bounds() -> LayoutBounds:
    return LayoutBounds.of(layouts().document(), default_catalog())


def _state(node: str, snapshot: NodeSnapshot) -> dict[str, Any]:
    try:
        status = VGPUNodeStateStatus(snapshot=encode_snapshot(snapshot, T0)).to_json()
    except nodestate.StatusBoundError:  # as a compromised node would write it
        status = {"snapshot": encode_snapshot_unbounded(snapshot)}
    return {
        "apiVersion": nodestate.API_VERSION,
        "kind": nodestate.KIND,
        "metadata": {"name": node},
        "spec": {"nodeName": node},
        "status": status,
    }


def _cr(*entries: PermittedEntry) -> dict[str, Any]:
    lists: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        lists.setdefault(e.list, []).append(e.to_json())
    return {
        "metadata": {
            "name": "kubevirt",
            "namespace": "kubevirt",
            "resourceVersion": "7",
            "annotations": {
                OWNERSHIP_ANNOTATION: json.dumps(sorted({e.resource for e in entries}))
            },
        },
        "spec": {"configuration": {"permittedHostDevices": lists}},
    }


def test_the_document_names_canonical_types_and_bounds_every_resource() -> None:
    doc = load_text(
        "version: v1\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices:\n"
        "        NVIDIA A2-4Q: 1\n  b:\n    - devices: all\n      vgpu-devices:\n"
        "        A100-1-5CGFX: 1\n",
        "layouts.yaml",
        catalog=default_catalog(),
    )
    b = LayoutBounds.of(doc, default_catalog())
    assert b.names == {"A2-4Q", "A100-1-5C"}
    assert b.source == "layouts.yaml"
    assert {"nvidia.com/NVIDIA_A2-4Q", "nvidia.com/GRID_A2-4Q"} <= b.resources()
    assert len(b.resources()) == 2 * len(b.names), "one per name and product prefix"


@pytest.mark.parametrize("count", [3_000, 10_000])
def test_made_up_types_justify_nothing_and_cost_a_bounded_summary(
    bounds: LayoutBounds, count: int
) -> None:
    """A node whose status claims ``count`` made-up types (10,000 passed the API server's
    request limit as gzip but not the CR's annotation limit, which made every write fail):
    its report holds no entry and a summary of five lines, or, for a scan larger than a
    status may hold (10,000: 0.5 MB of gzip), is not read at all; the plan with an honest
    node's types permits those alone, in a patch of a few KiB."""
    state = _state("evil", made_up_types("evil", count))
    hostile = read_report(state, bounds)
    assert hostile.entries == ()
    if len(state["status"]["snapshot"]["data"]) > nodestate.MAX_SNAPSHOT_DATA:
        assert hostile.unreadable is not None and count == 10_000
    else:
        assert hostile.outside.count == count and len(hostile.outside.first) == 5
        assert "not one layouts.yaml names" in str(hostile.outside)
    honest = read_report(_state("gpu-1", scan("a2-host.yaml", "gpu-1")), bounds)
    decision = decide(_cr(), [hostile, honest], Missing(), 0.0, GRACE)
    assert set(decision.plan.managed) == {
        "nvidia.com/NVIDIA_A2-4A",
        "nvidia.com/NVIDIA_A2-4C",
        "nvidia.com/NVIDIA_A2-4Q",
    }
    assert set(decision.plan.managed) <= bounds.resources()
    assert len(json.dumps(decision.plan.patch)) < 4096


def test_a_long_made_up_name_is_kept_short(bounds: LayoutBounds) -> None:
    snap = made_up_types("evil", 1)
    gpu = snap.gpus[0]
    name = "Z" * 100_000 + "-1Q"
    vgpu = gpu.vgpus[0].model_copy(update={"type_name": name, "type_sysfs_name": f"NVIDIA {name}"})
    offered = (gpu.offered[0].model_copy(update={"name": name}),)
    forged = gpu.model_copy(update={"vgpus": (vgpu,), "offered": offered})
    checked = checked_entries(snap.model_copy(update={"gpus": (forged,)}), bounds)
    assert checked.outside.count == 1 and len(checked.outside.first[0]) <= 240


def test_a_node_cannot_add_a_type_the_document_does_not_name(bounds: LayoutBounds) -> None:
    snapshot = scan("l40s-pair.yaml", "gpu-1")
    narrower = LayoutBounds(bounds.names - {"L40S-4Q"}, bounds.catalog)
    assert checked_entries(snapshot, bounds).entries != ()
    refused = checked_entries(snapshot, narrower)
    assert refused.entries == () and refused.outside.count == 2


def _a2(layout: SysfsInterface, *, node: str = "n", vf_device: int = 0x25B6) -> NodeSnapshot:
    snap = vf_backed_a2(node, vf_device)
    gpu = snap.gpus[0].model_copy(update={"layout": layout})
    return snap.model_copy(update={"gpus": (gpu,)})


def _renamed(snap: NodeSnapshot, sysfs_name: str) -> NodeSnapshot:
    gpu = snap.gpus[0]
    vgpus = tuple(v.model_copy(update={"type_sysfs_name": sysfs_name}) for v in gpu.vgpus)
    vfs = tuple(
        vf.model_copy(
            update={"creatable": tuple(t.model_copy(update={"sysfs_name": sysfs_name})
                                       for t in vf.creatable)}
        )
        for vf in gpu.vfs
    )  # fmt: skip
    return snap.model_copy(update={"gpus": (gpu.model_copy(update={"vgpus": vgpus, "vfs": vfs}),)})


def _t4_vf() -> NodeSnapshot:
    t4 = next(g for g in scan("t4-pair.yaml", "n").gpus if g.vgpus)
    a2 = vf_backed_a2("n", 0x1EB8).gpus[0]
    gpu = a2.model_copy(
        update={
            "device_id": t4.device_id,
            "subsystem_device_id": t4.subsystem_device_id,
            "model": t4.model,
        }
    )
    return _renamed(scan("t4-pair.yaml", "n").model_copy(update={"gpus": (gpu,)}), "GRID A2-4Q")


def _unknown_gpu() -> NodeSnapshot:
    snap = _a2(SysfsInterface.VENDOR_VFIO)
    gpu = snap.gpus[0].model_copy(update={"device_id": 0xFFFF, "model": "Made Up"})
    return snap.model_copy(update={"gpus": (gpu,)})


@pytest.mark.parametrize(
    ("snapshot", "why"),
    [
        (lambda: _a2(SysfsInterface.VENDOR_VFIO, vf_device=0x1234), "VF's device id 1234"),
        (lambda: _a2(SysfsInterface.MDEV), "a VF-backed vGPU on a GPU whose sysfs interface"),
        (lambda: _renamed(_a2(SysfsInterface.VENDOR_VFIO), "GRID A2-4Q"), "is not 'NVIDIA"),
        (_t4_vf, "is not a type of the T4"),
        (_unknown_gpu, "the catalog knows type 'A2-4Q' but not the GPU"),
    ],
    ids=["vf-device-id", "vf-on-mdev-gpu", "prefix", "other-model", "unknown-gpu"],
)
def test_the_kind_name_and_selector_are_the_catalogs(
    bounds: LayoutBounds, snapshot: Any, why: str
) -> None:
    checked = checked_entries(snapshot(), bounds)
    assert checked.entries == ()
    assert why in str(checked.outside), checked.outside


def test_an_honest_vf_backed_a2_is_permitted_with_the_catalogs_selector(
    bounds: LayoutBounds,
) -> None:
    checked = checked_entries(_a2(SysfsInterface.VENDOR_VFIO), bounds)
    assert checked.entries == (VF,) and not checked.outside


def _claims(**nodes: PermittedEntry) -> list[NodeReport]:
    return [NodeReport(node, (entry,)) for node, entry in nodes.items()]


def test_the_majority_settles_a_resource_never_the_first_node_by_name() -> None:
    """``a-evil`` sorts before the honest nodes: it reports the A2-4Q as a VF (with the
    catalog's own selector); the two honest nodes' mdev entry is written, on a fresh CR and
    on one that has it, and the hostile entry is named."""
    reports = _claims(**{"a-evil": VF, "gpu-1": MDEV, "gpu-2": MDEV})
    for order in (reports, list(reversed(reports))):
        fresh = decide(_cr(), order, Missing(), 0.0, GRACE)
        assert [(c.op, c.entry) for c in fresh.plan.changes] == [("add", MDEV)]
        (conflict,) = fresh.conflicts
        assert (conflict.node, conflict.entry, conflict.agreed) == ("a-evil", VF, MDEV)
        said = conflict.message
        assert "node a-evil reports nvidia.com/NVIDIA_A2-4Q as pciHostDevices" in said
        assert decide(_cr(MDEV), order, Missing(), 0.0, GRACE).plan.patch == ()


def test_a_tie_leaves_the_crs_entry_as_it_is() -> None:
    reports = _claims(**{"a-evil": VF, "gpu-1": MDEV})
    resolution = wanted_entries(reports)
    assert resolution.entries == () and resolution.unsettled == {A2_4Q}
    assert {c.node for c in resolution.conflicts} == {"a-evil", "gpu-1"}
    assert decide(_cr(), reports, Missing(), 0.0, GRACE).plan.patch == (), "nothing added"
    kept = decide(_cr(MDEV), reports, Missing({A2_4Q: 0.0}), 10 * GRACE, GRACE)
    assert kept.plan.patch == () and kept.waiting == (), "nor moved, nor removed"


def test_an_owned_entry_moves_when_every_node_reports_the_other_kind() -> None:
    decision = decide(_cr(MDEV), _claims(**{"gpu-1": VF, "gpu-2": VF}), Missing(), 0.0, GRACE)
    assert [(c.op, c.entry) for c in decision.plan.changes] == [("update", VF)]
    import jsonpatch

    after = jsonpatch.apply_patch(_cr(MDEV), list(decision.plan.patch))
    devices = after["spec"]["configuration"]["permittedHostDevices"]
    assert devices == {"mediatedDevices": [], "pciHostDevices": [VF.to_json()]}


def test_a_node_that_reports_one_resource_two_ways_is_refused_for_it(
    bounds: LayoutBounds,
) -> None:
    honest = scan("a2-host.yaml", "n")
    vf_gpu = _a2(SysfsInterface.VENDOR_VFIO).gpus[0].model_copy(update={"address": "0000:09:00.0"})
    both = honest.model_copy(update={"gpus": (*honest.gpus, vf_gpu)})
    checked = checked_entries(both, bounds)
    assert A2_4Q not in {e.resource for e in checked.entries}
    assert "is also reported as" in str(checked.outside)


def test_without_a_layouts_document_nothing_is_added_or_removed() -> None:
    decision = decide(
        _cr(MDEV), _claims(**{"gpu-1": VF}), Missing({A2_4Q: 0.0}), 10 * GRACE, GRACE, "no doc"
    )
    assert decision.plan.patch == () and decision.held == "no doc"


def _foreign_pci(**extra: Any) -> dict[str, Any]:
    return {
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "pciHostDevices": [
                        {"pciVendorSelector": "10de:26b9", "resourceName": "nvidia.com/L40S"}
                        | extra
                    ]
                }
            }
        }
    }


def test_a_foreign_pci_entry_over_the_nodes_vgpu_vfs_blocks() -> None:
    """KubeVirt 1.9+ advertises VFs itself for an entry without externalResourceProvider:
    the node's VFs would be offered under two resource names."""
    l40s = scan("l40s-pair.yaml", "n")
    (found,) = blockers(_foreign_pci(), {}, l40s)
    assert found.reason == "KubeVirtAdvertisesVFs" and "10DE:26B9" in found.message
    assert blockers(_foreign_pci(externalResourceProvider=True), {}, l40s) == ()
    owned = _foreign_pci()
    owned["metadata"] = {"annotations": {OWNERSHIP_ANNOTATION: '["nvidia.com/L40S"]'}}
    assert blockers(owned, {}, l40s) == ()
    assert blockers(_foreign_pci(), {}, scan("t4-pair.yaml", "n")) == (), "no VF on the node"


def test_the_layouts_types_are_the_simulated_hosts() -> None:
    """The shared document covers what the honest simulated hosts carry (else the tests
    above would prove nothing)."""
    b = LayoutBounds.of(layouts().document(), default_catalog())
    assert b.names == set(LAYOUT_TYPES)
    for spec in ("mixed.yaml", "a2-host.yaml", "l40s-pair.yaml"):
        checked = checked_entries(scan(spec, "n"), b)
        assert checked.entries and not checked.outside, (spec, checked.outside)
