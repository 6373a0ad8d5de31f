"""A GPU the host shows in MIG mode or in mixed-size mode: ``doctor`` fails it with
the check ``mode`` naming the limitation, and ``plan`` refuses to lay it out while
its modes are not read with nvidia-smi.

The sysfs trees are a simulated node's, with files edited the way the driver shows
these modes (the simulator models neither): in MIG mode with GPU instances every VF
lists MIG-backed types only; in mixed-size mode a GPU holds vGPUs of two
framebuffer sizes, which equal-size mode never allows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_state.cli.main import cli
from vgpu_state.sim.host import SimHost

REPO = Path(__file__).resolve().parent.parent
MIG = (
    "vgpu-state lays out a GPU in MIG mode only when it reads the GPU's modes "
    "with nvidia-smi (--nvidia-smi PATH)"
)
MIXED = (
    "vgpu-state lays out a GPU in mixed-size mode only when it reads the GPU's modes "
    "with nvidia-smi (--nvidia-smi PATH)"
)

A100_NODE = """\
node: mig-node
driver: {flavour: compute}
gpus:
  - {address: "0000:41:00.0", model: A100, layout: vendor-vfio}
"""

LAYOUTS = """\
version: v1
vgpu-configs:
  a100:
    - devices: all
      vgpu-devices: {A100-4C: 2}
  l40s:
    - devices: all
      vgpu-devices: {L40S-4Q: 2}
"""


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), env={"COLUMNS": "300", "NO_COLOR": "1"})
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def layouts(tmp_path: Path) -> Path:
    path = tmp_path / "layouts.yaml"
    path.write_text(LAYOUTS)
    return path


@pytest.fixture
def mig_mode_root(tmp_path: Path) -> Iterator[Path]:
    """An A100 in MIG mode with GPU instances: every VF lists MIG-backed types only."""
    spec = tmp_path / "a100.yaml"
    spec.write_text(A100_NODE)
    with SimHost(spec) as host:
        root = Path(host.root)
        pf = root / "bus/pci/devices/0000:41:00.0"
        for vf in sorted(pf.glob("virtfn*")):
            listing = vf.resolve() / "nvidia" / "creatable_vgpu_types"
            # Ids as a driver might number them; the names are what matters here.
            listing.write_text(
                "ID    : vGPU Name\n699   : NVIDIA A100-1-5C\n700   : NVIDIA A100-2-10C\n"
            )
        yield root


def test_doctor_fails_a_gpu_in_mig_mode_and_plan_refuses_it(
    mig_mode_root: Path, layouts: Path
) -> None:
    code, out, err = run("doctor", "--sysfs-root", str(mig_mode_root))
    assert code == 1, err
    assert (
        "[FAIL] mode: the GPU is in MIG mode: the driver lists MIG-backed types "
        f"(A100-1-5C, A100-2-10C); {MIG}" in out
    ), out
    code, out, err = run(
        "plan", "-f", str(layouts), "--sysfs-root", str(mig_mode_root),
        "--node", "mig-node", "-c", "a100",
    )  # fmt: skip
    assert code == 1
    assert "gpu[0000:41:00.0] (A100 PCIe 40GB): the GPU is in MIG mode" in err, err
    assert MIG in err


@pytest.fixture
def mixed_size_root() -> Iterator[Path]:
    """An L40S whose vGPUs have two framebuffer sizes, as only mixed-size mode allows."""
    with SimHost(REPO / "configs/sim/l40s-pair.yaml") as host:
        root = Path(host.root)
        pf = root / "bus/pci/devices/0000:a1:00.0"
        vfs = sorted((pf / name).resolve() for name in os.listdir(pf) if name.startswith("virtfn"))
        (vfs[0] / "nvidia/current_vgpu_type").write_text("1150\n")  # L40S-4Q
        (vfs[1] / "nvidia/current_vgpu_type").write_text("1155\n")  # L40S-24Q
        yield root


def test_doctor_fails_a_gpu_in_mixed_size_mode_and_plan_refuses_it(
    mixed_size_root: Path, layouts: Path
) -> None:
    code, out, err = run("doctor", "--sysfs-root", str(mixed_size_root))
    assert code == 1, err
    assert (
        "[FAIL] mode: the GPU is in mixed-size mode: its vGPUs have different framebuffer "
        f"sizes (L40S-4Q 4096 MiB, L40S-24Q 24576 MiB); {MIXED}" in out
    ), out
    # The other L40S (equal-size, two 4 GB vGPUs) passes the check.
    assert out.count("[FAIL] mode:") == 1
    code, out, err = run(
        "plan", "-f", str(layouts), "--sysfs-root", str(mixed_size_root),
        "--node", "l40s-node", "-c", "l40s",
    )  # fmt: skip
    assert code == 1
    assert "gpu[0000:a1:00.0] (L40S): the GPU is in mixed-size mode" in err, err
    assert MIXED in err


def test_the_mode_of_gpus_that_share_type_lists_is_read_from_each_gpu_s_own_lists() -> None:
    """While a fleet is planned, the MIG-backed names among a GPU's type lists are
    remembered by the lists (the GPUs of a fleet's identical nodes share them): a GPU
    with lists of its own is read afresh, one that shares another's lists but holds
    other vGPUs reads as that one. Nothing is remembered otherwise (an agent's scans
    are all new)."""
    from vgpu_state.catalog import default_catalog
    from vgpu_state.model.snapshot import CreatableType, SharedParts
    from vgpu_state.planner.support import MIG_LIMITATION, host_modes
    from vgpu_state.sim.spec import parse_spec

    with SimHost(parse_spec(A100_NODE, catalog=default_catalog()), in_memory=True) as host:
        plain = host.scan().gpus[0]
    mig_listed = (CreatableType(type_id=699, name="A100-1-5C", available=1),)
    in_mig_mode = plain.model_copy(
        update={"vfs": tuple(vf.model_copy(update={"creatable": mig_listed}) for vf in plain.vfs)}
    )
    in_mig = [
        f"the GPU is in MIG mode: the driver lists MIG-backed types (A100-1-5C); {MIG_LIMITATION}"
    ]
    with SharedParts.remembering():
        assert plain.vfs and host_modes(plain) == []
        assert host_modes(in_mig_mode) == in_mig
        assert host_modes(plain) == []
        # Lists shared with the first GPU, vGPUs of its own (as a decoded fleet's GPUs are).
        holding = plain.model_copy(update={"vgpus": ()})
        assert holding.vfs is plain.vfs and host_modes(holding) == []
        assert SharedParts._kept
    assert SharedParts._kept is None
    assert host_modes(in_mig_mode) == in_mig and host_modes(plain) == []
