"""MIG-backed and mixed-size layouts on simulated nodes that have ``nvidia-smi``, end to
end: config, scan (modes read with the stand-in), plan, apply, verification, and the
simulated host's write log (every sysfs write, ``sriov-manage`` and ``nvidia-smi``
call, in order).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource
from vgpu_state.model.errors import VgpuStateError
from vgpu_state.reconcile import Mode, Ports, Settings, reconcile_once
from vgpu_state.reconcile.report import Report
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.node import held_vgpus
from vgpu_state.sim.writelog import log_path
from vgpu_state.testing import FakeCluster

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent
PRO_PF, PRO_BUS = "0000:3b:00.0", "00000000:3B:00.0"
L40S_PF, L40S_BUS = "0000:26:00.0", "00000000:26:00.0"
HOLDER = "vm default/win-1"

LAYOUTS = """\
version: v1
vgpu-configs:
  mig:
    - devices: all
      vgpu-devices: {DC-1-24Q: 4}
  time-sliced:
    - devices: all
      vgpu-devices: {DC-24Q: 2}
  mixed:
    - devices: all
      mode: mixed-size
      vgpu-devices: {L40S-16Q: 1, L40S-8Q: 2}
"""


def type_id(model: str, name: str) -> int:
    found = CATALOG.model(model)
    assert found is not None
    t = found.type(name)
    assert t is not None
    return t.type_id


def reconcile(
    spec: Path, config: str, layouts: str = LAYOUTS, *, skip_blocked: bool = False
) -> Report:
    path = spec.with_name("layouts.yaml")
    path.write_text(layouts)
    with SimHost(spec, in_memory=True, autosave=True) as host:
        # The spec's holders, as the kubelet would name them on a real node.
        cluster = FakeCluster(host.scan().node, in_use=held_vgpus(host))
        ports = Ports(host, cluster, FileConfigSource(path, catalog=CATALOG))
        return reconcile_once(
            ports,
            Settings(catalog=CATALOG),
            mode=Mode.APPLY,
            config_name=config,
            skip_blocked=skip_blocked,
        )


def writes(spec: Path) -> list[tuple[str, str]]:
    """The simulated host's writes so far: (file or tool, what was written)."""
    log = log_path(spec)
    if not log.exists():
        return []
    lines = [json.loads(x) for x in log.read_text().splitlines()[1:]]
    return [(x["path"].rsplit("/", 1)[-1], x["data"]) for x in lines]


def copy(name: str, tmp_path: Path, edit: tuple[str, str] | None = None) -> Path:
    text = (REPO / "configs" / "sim" / name).read_text()
    if edit is not None:
        assert edit[0] in text
        text = text.replace(*edit)
    spec = tmp_path / name
    spec.write_text(text)
    return spec


def test_time_sliced_to_mig_and_back_in_the_documented_order(tmp_path: Path) -> None:
    spec = copy("rtx-pro-6000.yaml", tmp_path)
    first = reconcile(spec, "mig")
    assert first.applied is not None and first.applied.converged, first.applied
    dc_1_24q = type_id("RTX PRO 6000 Blackwell Server Edition", "DC-1-24Q")
    assert writes(spec) == [
        ("current_vgpu_type", "0"),
        ("current_vgpu_type", "0"),
        ("sriov-manage", f"-d {PRO_PF}"),
        ("nvidia-smi", f"-i {PRO_BUS} -mig 1"),
        ("sriov-manage", f"-e {PRO_PF}"),
        *[("nvidia-smi", f"mig -i {PRO_BUS} -cgi 1g.24gb -C")] * 4,
        *[("current_vgpu_type", str(dc_1_24q))] * 4,
    ]
    g = first.final.gpus[0]
    assert g.modes is not None and g.modes.mig and g.modes.gi_counts() == {"1g.24gb": 4}
    assert sorted(v.gpu_instance_id or 0 for v in g.vgpus) == [1, 2, 3, 4]
    done = len(writes(spec))
    second = reconcile(spec, "mig")
    assert second.plan.is_converged and second.applied is None
    assert len(writes(spec)) == done, "a second apply writes nothing"
    back = reconcile(spec, "time-sliced")
    assert back.applied is not None and back.applied.converged
    dc_24q = type_id("RTX PRO 6000 Blackwell Server Edition", "DC-24Q")
    assert writes(spec)[done:] == [
        *[("current_vgpu_type", "0")] * 4,
        ("sriov-manage", f"-d {PRO_PF}"),
        ("nvidia-smi", f"-i {PRO_BUS} -mig 0"),
        ("sriov-manage", f"-e {PRO_PF}"),
        *[("current_vgpu_type", str(dc_24q))] * 2,
    ]
    modes = back.final.gpus[0].modes
    assert modes is not None and not modes.mig and not modes.gpu_instances


def test_a_holder_defers_the_mode_change_and_nothing_is_written(tmp_path: Path) -> None:
    spec = copy(
        "rtx-pro-6000.yaml",
        tmp_path,
        ("{type: DC-24Q, vf: 0}", f'{{type: DC-24Q, vf: 0, in-use: "{HOLDER}"}}'),
    )
    report = reconcile(spec, "mig", skip_blocked=True)
    switch = report.plan.gpus[0].deferred_switch
    assert switch is not None and switch.waits_for == (HOLDER,)
    assert not report.plan.actions
    assert writes(spec) == []


@pytest.mark.parametrize("vfs_on", [True, False], ids=["vfs-on", "vfs-off"])
def test_mixed_size_sets_heterogeneous_mode_after_sriov_before_the_first_type(
    tmp_path: Path, vfs_on: bool
) -> None:
    edit = None if vfs_on else ("layout: vendor-vfio", "layout: vendor-vfio\n    sriov: false")
    spec = copy("l40s-mixed.yaml", tmp_path, edit)
    report = reconcile(spec, "mixed")
    assert report.applied is not None and report.applied.converged, report.applied
    ids = {n: type_id("L40S", n) for n in ("L40S-16Q", "L40S-8Q")}
    enable = [] if vfs_on else [("sriov-manage", f"-e {L40S_PF}")]
    assert writes(spec) == [
        *enable,
        ("nvidia-smi", f"vgpu -i {L40S_BUS} -shm 1"),
        ("current_vgpu_type", str(ids["L40S-16Q"])),
        ("current_vgpu_type", str(ids["L40S-8Q"])),
        ("current_vgpu_type", str(ids["L40S-8Q"])),
    ]
    assert reconcile(spec, "mixed").plan.is_converged


def test_an_infeasible_mix_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    spec = copy("l40s-mixed.yaml", tmp_path)
    bad = LAYOUTS.replace("{L40S-16Q: 1, L40S-8Q: 2}", "{L40S-48Q: 1, L40S-24Q: 1}")
    with pytest.raises(VgpuStateError) as e:
        reconcile(spec, "mixed", bad)
    assert "L40S-48Q" in str(e.value)
    assert writes(spec) == []
