"""``apply(plan, host)`` converges, verifies, is idempotent, and stops cleanly on driver errors.

Every scenario runs in-process (``SimHost``) and, where it is cheap, through
FUSE (``SysfsHost`` on a mounted simulator: real system calls, real errno).
"""

from __future__ import annotations

import errno
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource
from vgpu_state.executor import ApplyError, apply
from vgpu_state.host import SysfsHost
from vgpu_state.model.errors import DeviceBusyError, InterfaceMissingError, TypeNotCreatableError
from vgpu_state.model.plan import Plan
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.ports import HostPort
from vgpu_state.reconcile import Ports, Settings, deferred_replanner, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.node import held_vgpus
from vgpu_state.sim.spec import load_spec
from vgpu_state.statefiles import Journal
from vgpu_state.testing import FakeCluster

CATALOG = default_catalog()

SIM = Path(__file__).resolve().parent.parent / "configs" / "sim"
HOSTS = ["sim", pytest.param("fuse", marks=[pytest.mark.fuse])]


@contextmanager
def open_host(kind: str, spec: Path, tmp_path: Path) -> Iterator[HostPort]:
    """The node of ``spec`` in-process, or through a FUSE mount as a plain sysfs tree."""
    if kind == "sim":
        with SimHost(spec) as host:
            yield host
        return
    from vgpu_state.sim.fuse import fuse_unavailable_reason, mounted

    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(f"FUSE unusable: {reason}")
    with mounted(spec, tmp_path / "mnt") as m:
        yield SysfsHost(
            str(m.root),
            load_spec(spec, catalog=CATALOG).node,
            m.sriov_manage_command(),
            catalog=CATALOG,
        )


def plan_for(host: HostPort, layout: str, tmp_path: Path, in_use: dict[str, str]) -> Plan:
    config = tmp_path / "layout.yaml"
    config.write_text("version: v1\npolicy: {prune: true}\nvgpu-configs:\n  layout:\n" + layout)
    ports = Ports(
        host,
        FakeCluster(host.scan().node, in_use=in_use),
        FileConfigSource(config, catalog=CATALOG),
    )
    return reconcile_once(ports, Settings(catalog=default_catalog()), config_name="layout").plan


def layout_of(snapshot: NodeSnapshot) -> dict[str, Counter[str | None]]:
    return {g.address: Counter(v.type_name for v in g.vgpus) for g in snapshot.gpus}


SCENARIOS = {
    # mdev on VFs: the held A2-4C stays, the unwanted A2-4A goes, two A2-4Q are added.
    "mdev-vf": (
        "a2-host.yaml",
        "    - devices: all\n      vgpu-devices: {A2-4Q: 3, A2-4C: 1}\n",
        {"0000:08:00.0": {"A2-4Q": 3, "A2-4C": 1}},
    ),
    # mdev on the PF (T4): a size change on one GPU, a new layout on the other.
    "mdev-pf": (
        "t4-pair.yaml",
        '    - devices: ["0000:3b:00.0"]\n      vgpu-devices: {T4-4Q: 4}\n'
        '    - devices: ["0000:af:00.0"]\n      vgpu-devices: {T4-8Q: 2}\n',
        {"0000:3b:00.0": {"T4-4Q": 4}, "0000:af:00.0": {"T4-8Q": 2}},
    ),
    "vendor-vfio": (
        "l40s-pair.yaml",
        '    - devices: ["0000:26:00.0"]\n      vgpu-devices: {L40S-4Q: 5}\n'
        '    - devices: ["0000:a1:00.0"]\n      vgpu-devices: {L40S-12Q: 4}\n',
        {"0000:26:00.0": {"L40S-4Q": 5}, "0000:a1:00.0": {"L40S-12Q": 4}},
    ),
    # GPU 3f has its VFs off: enable SR-IOV, then create on the VFs that appear.
    "sriov-off-to-on": (
        "a16-board.yaml",
        '    - devices: ["0000:3f:00.0"]\n      vgpu-devices: {A16-4Q: 4}\n',
        {"0000:3f:00.0": {"A16-4Q": 4}},
    ),
}


@pytest.mark.parametrize("kind", HOSTS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_apply_converges_verifies_and_is_idempotent(
    scenario: str, kind: str, tmp_path: Path
) -> None:
    spec_name, layout, want = SCENARIOS[scenario]
    spec = SIM / spec_name
    journal = Journal(tmp_path / "journal.jsonl")
    with open_host(kind, spec, tmp_path) as host:
        in_use = dict(held_vgpus(SimHost(spec)))
        before = host.scan()
        p = plan_for(host, layout, tmp_path, in_use)
        assert p.actions and not p.blocked

        first = apply(p, host, journal=journal, in_use=in_use, replan=deferred_replanner(CATALOG))
        assert set(first.counts) == {"ok"}
        after = host.scan()
        for address, types in want.items():
            assert layout_of(after)[address] == Counter(types)
        for g in before.gpus:
            if g.address not in want:
                assert after.gpu(g.address) == g, f"{g.address} is not in the layout"
        for key in in_use:
            assert any(v.key == key for g in after.gpus for v in g.vgpus)

        second = apply(p, host, journal=journal, in_use=in_use, replan=deferred_replanner(CATALOG))
        assert second.steps and set(second.counts) == {"skipped"}
        assert host.scan() == after
        assert not plan_for(host, layout, tmp_path, in_use).has_changes
    outcomes = [r["outcome"] for r in journal.records() if r["event"] == "plan-end"]
    assert outcomes == ["converged", "converged"]


# Fault injection ----------------------------------------------------------------

FAULT_NODE = """\
node: fault-node
driver: {flavour: all}
sriov-manage: true
gpus:
  - address: "0000:08:00.0"
    model: A2
    vgpus: [{type: A2-4Q, vf: 0}, {type: A2-4Q, vf: 1}]
  - address: "0000:3b:00.0"
    model: T4
    vgpus: [{type: T4-4Q}, {type: T4-4Q}]
  - address: "0000:5e:00.0"
    model: A2
    sriov: false
  - address: "0000:81:00.0"
    model: L40S
    layout: vendor-vfio
    vgpus: [{type: L40S-12Q, vf: 0}, {type: L40S-12Q, vf: 1}]
faults:
  - FAULT
"""

FAULT_LAYOUT = (
    '    - devices: ["0000:08:00.0"]\n      vgpu-devices: {A2-8Q: 2}\n'
    '    - devices: ["0000:3b:00.0"]\n      vgpu-devices: {T4-8Q: 2}\n'
    '    - devices: ["0000:5e:00.0"]\n      vgpu-devices: {A2-4Q: 2}\n'
    '    - devices: ["0000:81:00.0"]\n      vgpu-devices: {L40S-24Q: 2}\n'
)
GPUS = ["0000:08:00.0", "0000:3b:00.0", "0000:5e:00.0", "0000:81:00.0"]


def _work(p: Plan) -> Counter[tuple[str, str, str | None]]:
    return Counter((a.kind.value, a.gpu, a.type_name) for a in p.actions)


FAULTS = {
    # (fault, failing GPU, error class, errno, sysfs file, host kind)
    "ebusy-on-remove": (
        '{op: remove, nth: 2, errno: EBUSY, path: "*/0000:3b:00.0/*/remove"}',
        "0000:3b:00.0",
        DeviceBusyError,
        errno.EBUSY,
        "/remove",
        "sim",
    ),
    "eio-on-create": (
        '{op: create, nth: 1, errno: EIO, path: "*/0000:3b:00.0/mdev_supported_types/*"}',
        "0000:3b:00.0",
        TypeNotCreatableError,
        errno.EIO,
        "/create",
        "fuse",
    ),
    "enoent-on-sriov": (
        "{op: sriov, nth: 1, errno: ENOENT}",
        "0000:5e:00.0",
        InterfaceMissingError,
        errno.ENOENT,
        "sriov",
        "sim",
    ),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_a_driver_error_stops_the_apply_cleanly(name: str, tmp_path: Path) -> None:
    fault, failing, error_cls, code, path_part, kind = FAULTS[name]
    spec = tmp_path / "node.yaml"
    spec.write_text(FAULT_NODE.replace("FAULT", fault))
    journal = Journal(tmp_path / "journal.jsonl")
    with open_host(kind, spec, tmp_path) as host:
        before = host.scan()
        p = plan_for(host, FAULT_LAYOUT, tmp_path, {})
        with pytest.raises(ApplyError) as info:
            apply(p, host, journal=journal, replan=deferred_replanner(CATALOG))
        e = info.value
        after = host.scan()

        assert isinstance(e.cause, error_cls) and e.cause.errno == code
        assert e.action.gpu == failing
        message = str(e)
        assert e.action.address in message and e.action.kind.value in message
        assert path_part in e.cause.path and e.cause.path in message
        assert errno.errorcode[code] in message and e.cause.meaning in message
        assert f"{len(e.not_run)} step(s) not run" in message
        assert e.not_run == p.actions[p.actions.index(e.action) + 1 :]

        # GPUs after the failing one were not touched; the ones before converged.
        later = GPUS[GPUS.index(failing) + 1 :]
        for address in later:
            assert after.gpu(address) == before.gpu(address)
        remaining = plan_for(host, FAULT_LAYOUT, tmp_path, {})
        assert {a.gpu for a in remaining.actions} == {failing, *later}
        # The new plan is exactly the work that did not happen.
        undone = Counter((a.kind.value, a.gpu, a.type_name) for a in (e.action, *e.not_run))
        assert _work(remaining) == undone

    [failed] = [r for r in journal.records() if r.get("outcome") == "failed" and "kind" in r]
    assert (failed["address"], failed["errno"]) == (e.action.address, code)
    assert journal.unfinished() == []
