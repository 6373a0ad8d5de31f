"""How much of the host an apply reads: one scan of each GPU it changed, one of the node.

The host is the simulator wrapped in a recording port, which counts full node
scans and one-GPU scans. An apply that reads the whole node after every GPU
makes its time grow with the square of the node's GPUs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.executor import VerificationError, apply
from vgpu_state.model.errors import HostUnreadableError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.ports import MemoryCluster
from vgpu_state.reconcile import Mode, Ports, Settings, deferred_replanner, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec
from vgpu_state.testing import RecordingHost

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent

L40S = [f"0000:{0x21 + i:02x}:00.0" for i in range(6)]

# Six L40S with vendor-specific VFIO, four L40S-12Q each; two A16 with mdevs on
# VFs, one of them with SR-IOV still off (its creates wait for the VFs).
SPEC = (
    "node: n1\ndriver: {flavour: graphics}\ngpus:\n"
    + "".join(
        f'  - {{address: "{a}", model: L40S, layout: vendor-vfio, vgpus: '
        "[{type: L40S-12Q, vf: 0}, {type: L40S-12Q, vf: 1}, {type: L40S-12Q, vf: 2}, "
        "{type: L40S-12Q, vf: 3}]}\n"
        for a in L40S
    )
    + '  - {address: "0000:3d:00.0", model: A16, vgpus: [{type: A16-4Q, vf: 0}]}\n'
    + '  - {address: "0000:3e:00.0", model: A16}\n'
)


def _layout(changed: list[str]) -> str:
    devices = ", ".join(f'"{a}"' for a in changed)
    return (
        "version: v1\npolicy: {prune: true}\nvgpu-configs:\n  c:\n"
        f"    - devices: [{devices}]\n      vgpu-devices: {{L40S-8Q: 4}}\n"
        '    - devices: ["0000:3d:00.0", "0000:3e:00.0"]\n      vgpu-devices: {A16-2Q: 2}\n'
    )


def _ports(host: RecordingHost, changed: list[str]) -> Ports:
    config = StaticConfigSource(load_text(_layout(changed), "c.yaml", catalog=CATALOG))
    return Ports(host, MemoryCluster("n1"), config)


def _sim() -> SimHost:
    host = SimHost(parse_spec(SPEC, catalog=CATALOG), in_memory=True)
    # The second A16 has its VFs off: the plan enables SR-IOV and its creates wait.
    host.disable_sriov("0000:3e:00.0")
    return host


@pytest.mark.parametrize("changed", [1, 3, 6])
def test_an_apply_scans_the_node_twice_whatever_its_size(changed: int, tmp_path: Path) -> None:
    host = RecordingHost(_sim())
    settings = Settings(catalog=CATALOG, journal_path=tmp_path / "journal.jsonl")
    ports = _ports(host, L40S[:changed])
    report = reconcile_once(ports, settings, mode=Mode.APPLY, config_name="c")
    assert report.converged and report.applied is not None
    # One full scan to plan, one to verify the node at the end: not one per GPU.
    assert host.scans == 2
    # While it works, each GPU it changed is read back alone (the A16 whose VFs
    # came up twice: after SR-IOV, and after the creates that waited for it).
    want = Counter({a: 1 for a in L40S[:changed]} | {"0000:3d:00.0": 1, "0000:3e:00.0": 2})
    assert Counter(host.gpu_scans) == want
    after = {str(g.address): Counter(v.type_name for v in g.vgpus) for g in report.final.gpus}
    for a in L40S:
        assert after[a] == (Counter({"L40S-8Q": 4}) if a in L40S[:changed] else {"L40S-12Q": 4})
    assert after["0000:3d:00.0"] == after["0000:3e:00.0"] == {"A16-2Q": 2}
    # What the report calls final is a read taken after the last step.
    assert report.final == host.inner.scan()


def test_a_given_snapshot_leaves_one_full_scan_for_the_final_verification() -> None:
    host = RecordingHost(_sim())
    plan = reconcile_once(_ports(host, L40S), Settings(catalog=CATALOG), config_name="c").plan
    live = host.inner.scan()
    host.scans = 0
    result = apply(plan, host, snapshot=live, replan=deferred_replanner(CATALOG))
    assert not result.notes and host.scans == 1


class _LosesAGpu:
    """A host whose one-GPU reads say the GPU is gone, or the host unreadable."""

    def __init__(self, inner: SimHost, unreadable: bool) -> None:
        self.inner, self.unreadable = inner, unreadable

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def scan_gpu(self, address: str) -> NodeSnapshot:
        if self.unreadable:
            return NodeSnapshot(node="n1", error="cannot read the host: Input/output error")
        return NodeSnapshot(node="n1")


@pytest.mark.parametrize("unreadable", [False, True])
def test_the_read_after_a_gpu_still_catches_what_went_wrong(unreadable: bool) -> None:
    sim = _sim()
    recorder = RecordingHost(sim)
    ports = _ports(recorder, L40S[:1])
    plan = reconcile_once(ports, Settings(catalog=CATALOG), config_name="c").plan
    expected = HostUnreadableError if unreadable else VerificationError
    with pytest.raises(expected) as info:
        apply(plan, _LosesAGpu(sim, unreadable), replan=deferred_replanner(CATALOG))  # type: ignore[arg-type]
    if unreadable:
        assert "Input/output error" in str(info.value)
    else:
        assert "missing" in str(info.value)
