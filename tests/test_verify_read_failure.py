"""A read that fails while verifying an apply is reported as that read failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import V, build_gpu, build_snapshot, desired
from vgpu_state.catalog import default_catalog
from vgpu_state.executor import VerificationError, apply
from vgpu_state.model.errors import HostUnreadableError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner import plan
from vgpu_state.statefiles import Journal

CATALOG = default_catalog()


class _Host:
    """Creates succeed; the re-scan then cannot read the GPU's vGPUs (or the host)."""

    def __init__(self, before: NodeSnapshot, after: NodeSnapshot) -> None:
        self.before, self.after, self.writes = before, after, 0

    def scan(self) -> NodeSnapshot:
        return self.after if self.writes else self.before

    def scan_gpu(self, address: str) -> NodeSnapshot:
        return self.scan().only_gpu(address)

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        self.writes += 1

    def remove_mdev(self, uuid: str) -> None:
        self.writes += 1

    def enable_sriov(self, pf: str) -> None: ...
    def disable_sriov(self, pf: str) -> None: ...
    def set_vf_type(self, vf: str, type_id: int) -> None: ...
    def clear_vf_type(self, vf: str) -> None: ...
    def set_mig_mode(self, pf: str, enabled: bool) -> None: ...
    def create_gpu_instance(self, pf: str, profile: str) -> int:
        return 1

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None: ...
    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None: ...


def _setup() -> tuple[NodeSnapshot, object]:
    g = build_gpu("0000:3b:00.0", "T4", vgpus=[V("T4-8C")])
    snap = build_snapshot(g)
    p = plan(desired({g.address: {"T4-8C": 2}}, snap), snap, catalog=CATALOG)
    assert p.actions
    return snap, p


def test_a_failed_read_is_reported_as_such_not_as_missing_vgpus(tmp_path: Path) -> None:
    snap, p = _setup()
    g = snap.gpus[0]
    problem = f"cannot list /sys/bus/pci/devices/{g.address}: Input/output error"
    broken = snap.model_copy(update={"gpus": (g.model_copy(update={"problems": (problem,)}),)})
    journal = Journal(tmp_path / "j.jsonl")
    with pytest.raises(HostUnreadableError) as info:
        apply(p, _Host(snap, broken), journal=journal)  # type: ignore[arg-type]
    assert not isinstance(info.value, VerificationError)
    assert problem in str(info.value) and "missing" not in str(info.value)
    assert list(journal.records())[-1]["outcome"] == "failed"


def test_a_host_gone_during_verification_is_reported_as_such(tmp_path: Path) -> None:
    snap, p = _setup()
    gone = NodeSnapshot(node=snap.node, error="cannot read the host: Transport endpoint is "
                        "not connected")
    journal = Journal(tmp_path / "j.jsonl")
    with pytest.raises(HostUnreadableError, match="Transport endpoint is not connected"):
        apply(p, _Host(snap, gone), journal=journal)  # type: ignore[arg-type]
    assert list(journal.records())[-1]["outcome"] == "failed"
