"""Held vGPUs stay protected on every path: key forms, unreadable types."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from tests.builders import V, build_gpu, build_snapshot, desired
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.model.plan import ActionKind
from vgpu_state.model.snapshot import Vgpu
from vgpu_state.planner import plan

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"
T4_VGPU = "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"


def test_a_vgpu_whose_type_cannot_be_read_is_never_destroyed() -> None:
    g = build_gpu("0000:3b:00.0", "T4", vgpus=[V("T4-8C")])
    unknown = "11111111-2222-4333-8444-555555555555"
    problem = (
        f"/sys/bus/pci/devices/0000:3b:00.0/{unknown}/mdev_type missing: "
        f"mdev {unknown} has no type"
    )
    g = g.model_copy(
        update={
            "vgpus": (*g.vgpus, Vgpu(kind="mdev", parent=g.address, uuid=unknown)),
            "problems": (problem,),
        }
    )
    snap = build_snapshot(g)
    p = plan(desired({g.address: {"T4-8C": 1}}, snap), snap, catalog=CATALOG)
    assert not [a for a in p.actions if a.kind is ActionKind.DESTROY]
    [blocked] = p.blocked
    assert blocked.address == f"gpu[{g.address}].vgpu[{unknown}]"
    assert problem in blocked.reason and "never destroyed" in blocked.reason


def test_in_use_keys_are_normalised_and_unknown_keys_warned(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    r = CliRunner().invoke(
        cli,
        ["plan", "-f", str(CONFIG), "--sim", str(spec), "--in-use",
         f"{T4_VGPU.upper()}=vm prod/db", "--in-use", "3b:00.7=pod x/y"],
    )
    assert r.exit_code == 0, r.output
    assert "cannot be destroyed\n      in use by vm prod/db" in r.stdout
    assert "will be destroyed" not in r.stdout
    assert "warning: in-use key '3b:00.7' (held by pod x/y) matches no vGPU" in r.stderr
