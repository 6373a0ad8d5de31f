"""A GPU's mode as desired state, end to end through the CLI on simulated nodes.

An RTX PRO 6000 Blackwell node goes from time-sliced vGPUs to MIG-backed ones and
back; an L40S gets vGPUs of different sizes in mixed-size mode. The order of what
reached the host is read from the simulator's write log (every sysfs write,
``sriov-manage`` and ``nvidia-smi`` call, in order) as it stood before the apply
saved the node; the state after each apply from the saved spec and a fresh scan.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from vgpu_state.cli.main import cli
from vgpu_state.sim import writelog
from vgpu_state.sim.writelog import WriteLog, log_path

REPO = Path(__file__).resolve().parent.parent
PF = "0000:3b:00.0"
L40S_PF = "0000:26:00.0"

LAYOUTS = """\
version: v1
vgpu-configs:
  mig:
    - devices: all
      vgpu-devices: {DC-1-24Q: 4}
  sliced:
    - devices: all
      vgpu-devices: {DC-24Q: 4}
  mixed:
    - devices: all
      mode: mixed-size
      vgpu-devices: {L40S-24Q: 1, L40S-12Q: 2}
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[tuple[str, str]]]]:
    """Each apply's write log, as it stood when the apply saved the node."""
    taken: list[list[tuple[str, str]]] = []
    original = WriteLog.saved

    def saved(self: WriteLog, spec_bytes: bytes) -> None:
        path = self.path
        lines = path.read_text().splitlines()[1:] if path.exists() else []
        taken.append([(r["path"], r["data"]) for r in map(json.loads, lines)])
        original(self, spec_bytes)

    monkeypatch.setattr(writelog.WriteLog, "saved", saved)
    yield taken


def spec_of(path: Path) -> dict[str, object]:
    data = YAML(typ="safe").load(path.read_text())
    assert isinstance(data, dict)
    return data


def gpu_of(path: Path) -> dict[str, object]:
    gpus = spec_of(path)["gpus"]
    assert isinstance(gpus, list)
    gpu = gpus[0]
    assert isinstance(gpu, dict)
    return gpu


def kinds(log: list[tuple[str, str]]) -> list[str]:
    """What each logged write was, in order: ``type <id>``, ``sriov -e``, ``smi ...``."""
    out = []
    for path, data in log:
        text = data.strip()
        if path.endswith("current_vgpu_type"):
            out.append("clear" if text == "0" else "type")
        elif path.endswith("sriov-manage"):
            out.append(f"sriov {text.split()[0]}")
        elif "nvidia-smi" in path:
            args = text.split()
            if "-mig" in args:
                out.append(f"mig {args[args.index('-mig') + 1]}")
            elif "-cgi" in args:
                out.append("cgi")
            elif "-dgi" in args or "-dci" in args:
                out.append("dgi")
            elif "-shm" in args:
                out.append(f"shm {args[args.index('-shm') + 1]}")
            else:
                out.append("smi " + text)
        else:
            out.append(path)
    return out


def first(seq: list[str], item: str) -> int:
    return seq.index(item)


def last(seq: list[str], item: str) -> int:
    return len(seq) - 1 - seq[::-1].index(item)


@pytest.fixture
def pro_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layouts.yaml").write_text(LAYOUTS)
    spec = tmp_path / "node.yaml"
    spec.write_text((REPO / "configs/sim/rtx-pro-6000.yaml").read_text())
    return spec


def apply(config: str, spec: Path) -> tuple[int, str, str]:
    return run("apply", "-f", "layouts.yaml", "-c", config, "--sim", str(spec), "--auto-approve")


def test_time_sliced_to_mig_backed_and_back_in_the_documented_order(
    pro_node: Path, logged: list[list[tuple[str, str]]]
) -> None:
    code, out, err = run("plan", "-f", "layouts.yaml", "-c", "mig", "--sim", str(pro_node))
    assert code == 0, err
    assert "MIG mode: off → on" in out
    assert "experimental: inferred, not verified on hardware" in out + err

    code, out, err = apply("mig", pro_node)
    assert code == 0, out + err
    steps = kinds(logged[-1])
    # The time-sliced vGPUs go, the VFs go off, MIG mode on, VFs on, the GPU
    # instances, then the vGPU types (reference: nvidia-sysfs.md §4.3).
    assert steps.count("clear") == 2 and steps.count("type") == 4, steps
    assert last(steps, "clear") < first(steps, "sriov -d") < first(steps, "mig 1"), steps
    assert first(steps, "mig 1") < first(steps, "sriov -e") < first(steps, "cgi"), steps
    assert last(steps, "cgi") < first(steps, "type"), steps
    gpu = gpu_of(pro_node)
    assert gpu.get("mig-mode") is True
    instances = gpu.get("gpu-instances")
    assert isinstance(instances, list) and len(instances) == 4
    vgpus = gpu.get("vgpus")
    assert isinstance(vgpus, list) and [v["type"] for v in vgpus] == ["DC-1-24Q"] * 4
    assert len({v.get("gpu-instance") for v in vgpus}) == 4, "one vGPU per GPU instance"

    # A fresh scan shows it, and a second apply changes nothing.
    code, out, err = run("scan", "--sim", str(pro_node), "-o", "json")
    assert code == 0, err
    scanned = json.loads(out)["gpus"][0]
    assert scanned["modes"]["mig"] is True and len(scanned["modes"]["gpu_instances"]) == 4
    before = pro_node.read_bytes()
    applies = len(logged)
    code, out, err = apply("mig", pro_node)
    assert code == 0, out + err
    assert all(not log for log in logged[applies:]), "the second apply wrote nothing"
    assert pro_node.read_bytes() == before

    # Back to time-sliced.
    code, out, err = apply("sliced", pro_node)
    assert code == 0, out + err
    steps = kinds(logged[-1])
    assert steps.count("clear") == 4 and steps.count("type") == 4, steps
    assert last(steps, "clear") < first(steps, "sriov -d") < first(steps, "mig 0"), steps
    assert first(steps, "mig 0") < first(steps, "sriov -e") < first(steps, "type"), steps
    gpu = gpu_of(pro_node)
    assert not gpu.get("mig-mode") and not gpu.get("gpu-instances")
    vgpus = gpu.get("vgpus")
    assert isinstance(vgpus, list) and [v["type"] for v in vgpus] == ["DC-24Q"] * 4


def test_a_held_vgpu_defers_the_mode_change_and_nothing_is_written(
    pro_node: Path, logged: list[list[tuple[str, str]]]
) -> None:
    text = pro_node.read_text().replace(
        "- {type: DC-24Q, vf: 0}", '- {type: DC-24Q, vf: 0, in-use: "vm default/win-1"}'
    )
    pro_node.write_text(text)
    code, out, err = run("plan", "-f", "layouts.yaml", "-c", "mig", "--sim", str(pro_node))
    assert "vm default/win-1" in out + err
    assert "MIG mode: off → on" not in out
    code, out, err = apply("mig", pro_node)
    assert code == 1, "not converged: the switch waits"
    assert "vm default/win-1" in out + err
    assert all(not log for log in logged), logged
    assert pro_node.read_text() == text, "the node is as it was"


@pytest.fixture
def l40s_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layouts.yaml").write_text(LAYOUTS)
    spec = tmp_path / "node.yaml"
    text = (REPO / "configs/sim/l40s-mixed.yaml").read_text()
    spec.write_text(
        text.replace("    layout: vendor-vfio\n", "    layout: vendor-vfio\n    sriov: false\n")
    )
    return spec


def test_mixed_size_mode_is_set_after_sriov_and_before_the_first_type(
    l40s_node: Path, logged: list[list[tuple[str, str]]]
) -> None:
    code, out, err = apply("mixed", l40s_node)
    assert code == 0, out + err
    steps = kinds(logged[-1])
    assert first(steps, "sriov -e") < first(steps, "shm 1") < first(steps, "type"), steps
    types = [data.strip() for path, data in logged[-1] if path.endswith("current_vgpu_type")]
    gpu = gpu_of(l40s_node)
    assert gpu.get("heterogeneous") is True
    vgpus = gpu.get("vgpus")
    assert isinstance(vgpus, list)
    assert sorted(v["type"] for v in vgpus) == ["L40S-12Q", "L40S-12Q", "L40S-24Q"]
    # The largest first: the L40S-24Q's id was written before the L40S-12Q's.
    by_vf = {v["vf"]: v["type"] for v in vgpus}
    assert len(types) == 3 and by_vf[min(by_vf)] == "L40S-24Q", (types, by_vf)
    applies = len(logged)
    code, out, err = apply("mixed", l40s_node)
    assert code == 0, out + err
    assert all(not log for log in logged[applies:])


def test_an_infeasible_mix_is_refused_at_plan_time_and_nothing_is_written(
    l40s_node: Path, logged: list[list[tuple[str, str]]]
) -> None:
    before = l40s_node.read_text()
    Path("bad.yaml").write_text(
        "version: v1\nvgpu-configs:\n  too-much:\n    - devices: all\n"
        "      mode: mixed-size\n      vgpu-devices: {L40S-24Q: 1, L40S-16Q: 2}\n"
    )
    for command in ("plan", "apply"):
        extra = ["--auto-approve"] if command == "apply" else []
        code, _, err = run(
            command, "-f", "bad.yaml", "-c", "too-much", "--sim", str(l40s_node), *extra
        )
        assert code == 1, command
        assert "L40S-24Q" in err and "L40S-16Q" in err, err
    assert l40s_node.read_text() == before
    assert not logged and not log_path(l40s_node).exists()


def test_scan_shows_where_vgpus_landed_and_the_room_left_in_the_gpu_instances(
    pro_node: Path,
) -> None:
    Path("partial.yaml").write_text(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {DC-1-12Q: 3}\n"
    )
    code, out, err = run(
        "apply", "-f", "partial.yaml", "-c", "c", "--sim", str(pro_node), "--auto-approve"
    )
    assert code == 0, out + err
    code, out, err = run("scan", "--sim", str(pro_node))
    assert code == 0, err
    text = " ".join(out.split())
    assert "GPU instance 1: 1g.24gb" in text and "GPU instance 2: 1g.24gb" in text
    assert text.count("(GPU instance 1, placement") == 2
    assert text.count("(GPU instance 2, placement") == 1
    # Two 1g.24gb instances hold two DC-1-12Q each: one more fits, not the
    # catalog's eight less three.
    assert "DC-1-12Q ×1" in text, out


def test_scan_counts_the_slots_left_in_mixed_size_mode(l40s_node: Path) -> None:
    Path("some.yaml").write_text(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      mode: mixed-size\n"
        "      vgpu-devices: {L40S-24Q: 1, L40S-12Q: 1}\n"
    )
    code, out, err = run(
        "apply", "-f", "some.yaml", "-c", "c", "--sim", str(l40s_node), "--auto-approve"
    )
    assert code == 0, out + err
    code, out, err = run("scan", "--sim", str(l40s_node))
    assert code == 0, err
    text = " ".join(out.split())
    assert "mixed-size" in text
    # 36 of 48 one-GiB slots are taken: one more L40S-12Q, three L40S-4Q, no L40S-24Q.
    assert "L40S-12Q ×1" in text and "L40S-4Q ×3" in text, out
    assert "L40S-24Q ×" not in text


def test_a_mode_change_alone_makes_a_saved_plan_stale(
    l40s_node: Path, logged: list[list[tuple[str, str]]]
) -> None:
    text = l40s_node.read_text().replace("    sriov: false\n", "")
    l40s_node.write_text(text)
    code, _, err = run(
        "plan", "-f", "layouts.yaml", "-c", "mixed", "--sim", str(l40s_node), "--out", "p.json"
    )
    assert code == 0, err
    changed = text.replace(
        "    layout: vendor-vfio\n", "    layout: vendor-vfio\n    heterogeneous: true\n"
    )
    l40s_node.write_text(changed)
    code, _, err = run("apply", "p.json", "--sim", str(l40s_node), "--auto-approve")
    assert code == 1
    assert "saved plan is stale" in err
    assert f"gpu[{L40S_PF}] modes MIG N/A, mixed-size off -> MIG N/A, mixed-size on" in err, err
    assert l40s_node.read_text() == changed and not any(logged)


def test_a_new_mig_geometry_that_the_kept_instances_would_split_is_laid_out_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("node.yaml").write_text(
        'node: a100\nnvidia-smi: true\ngpus:\n  - address: "0000:3b:00.0"\n'
        "    model: A100 PCIe 40GB\n    layout: vendor-vfio\n"
    )
    Path("l.yaml").write_text(
        "version: v1\nvgpu-configs:\n  seven:\n    - devices: all\n"
        "      vgpu-devices: {A100-1-5C: 7}\n  mix:\n    - devices: all\n"
        "      vgpu-devices: {A100-3-20C: 1, A100-2-10C: 1, A100-1-5C: 2}\n"
    )
    for config in ("seven", "mix"):
        code, out, err = run(
            "apply", "-f", "l.yaml", "-c", config, "--sim", "node.yaml", "--auto-approve"
        )
        assert code == 0, out + err
        assert "Apply complete" in out
    # Two 1g.5gb instances kept at the GPU's first slices would leave no aligned run for
    # the 2g.10gb: every instance was made again, largest first.
    gpu = gpu_of(Path("node.yaml"))
    instances = gpu.get("gpu-instances")
    assert isinstance(instances, list)
    profiles = sorted(i["profile"] if isinstance(i, dict) else i for i in instances)
    assert profiles == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    code, out, err = run(
        "apply", "-f", "l.yaml", "-c", "mix", "--sim", "node.yaml", "--auto-approve"
    )
    assert code == 0 and "No changes" in out, out + err


@pytest.mark.parametrize("held", [False, True])
def test_mixed_size_vgpus_are_placed_again_to_make_room_in_the_slots(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logged: list[list[tuple[str, str]]],
    held: bool,
) -> None:
    monkeypatch.chdir(tmp_path)
    holder = ', in-use: "vm default/a"' if held else ""
    node = (
        'node: l\nnvidia-smi: true\ngpus:\n  - address: "0000:26:00.0"\n'
        "    model: L40S\n    layout: vendor-vfio\n    heterogeneous: true\n    vgpus:\n"
        f"      - {{type: L40S-8Q, vf: 0, placement: 0{holder}}}\n"
        "      - {type: L40S-16Q, vf: 1, placement: 16}\n"
    )
    Path("node.yaml").write_text(node)
    Path("l.yaml").write_text(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      mode: mixed-size\n"
        "      vgpu-devices: {L40S-8Q: 1, L40S-16Q: 1, L40S-24Q: 1}\n"
    )
    # 8Q at slot 0 and 16Q at 16 leave no aligned 24-slot run: free, they are made
    # again, largest first; with the 8Q held at 0 no placement fits, and nothing moves.
    code, out, err = run("apply", "-f", "l.yaml", "-c", "c", "--sim", "node.yaml", "--auto-approve")
    if held:
        assert code == 1 and "L40S-24Q cannot be created" in out + err, out + err
        assert Path("node.yaml").read_text() == node and not any(logged)
        return
    assert code == 0, out + err
    assert kinds(logged[-1]).count("clear") == 2
    vgpus = gpu_of(Path("node.yaml")).get("vgpus")
    assert isinstance(vgpus, list)
    placed = sorted((v["type"], v.get("placement")) for v in vgpus)
    assert placed == [("L40S-16Q", 32), ("L40S-24Q", 0), ("L40S-8Q", 24)], placed
    code, out, err = run("apply", "-f", "l.yaml", "-c", "c", "--sim", "node.yaml", "--auto-approve")
    assert code == 0 and "No changes" in out, out + err


@pytest.mark.fuse
@pytest.mark.usefixtures("require_fuse")
def test_plan_apply_scan_and_assert_through_fuse_with_the_nvidia_smi_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex

    from vgpu_state.sim.fuse import mounted

    monkeypatch.chdir(tmp_path)
    Path("layouts.yaml").write_text(LAYOUTS)
    spec = tmp_path / "node.yaml"
    spec.write_text((REPO / "configs/sim/rtx-pro-6000.yaml").read_text())
    with mounted(spec, tmp_path / "mnt") as m:
        root = str(m.root)
        smi = shlex.join(m.nvidia_smi_command())
        sriov = shlex.join(m.sriov_manage_command())
        common = ["-f", "layouts.yaml", "-c", "mig", "--sysfs-root", root, "--node", "n"]
        common += ["--state-dir", str(tmp_path / "state")]
        # Without nvidia-smi the MIG-backed layout cannot be planned, and the error says how.
        code, out, err = run("plan", *common, "--nvidia-smi", "")
        assert code == 1 and "--nvidia-smi PATH" in err, out + err
        code, out, err = run("plan", *common, "--nvidia-smi", smi)
        assert code == 0 and "MIG mode: off → on" in out, out + err
        code, out, err = run("assert", *common, "--nvidia-smi", smi)
        assert code == 1
        code, out, err = run(
            "apply", *common, "--nvidia-smi", smi, "--sriov-manage", sriov, "--auto-approve"
        )
        assert code == 0 and "Apply complete" in out, out + err
        code, out, err = run("assert", *common, "--nvidia-smi", smi)
        assert code == 0, out + err
        code, out, err = run("scan", "--sysfs-root", root, "--nvidia-smi", smi, "-o", "json")
        assert code == 0, err
        modes = json.loads(out)["gpus"][0]["modes"]
        assert modes["mig"] is True and len(modes["gpu_instances"]) == 4
