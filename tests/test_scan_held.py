"""``scan`` marks which pod, VM or process holds each vGPU and shows how many more
vGPUs of each type still fit, in text and JSON.

"Still fits" counts what the GPU's framebuffer leaves room for beside the vGPUs that
exist, not the free VFs that list a type: an L40S with one 12 GB vGPU lists the
12 GB types on 31 free VFs, and three more fit.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from vgpu_state.cli.main import cli
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.proc import open_proc

REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "configs" / "sim"
HELD_A2 = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"  # in use by "vm default/win-1" in the spec
FREE_A2 = "c728e022-f16f-434b-ad2c-9665ee634d3d"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), env={"COLUMNS": "200", "NO_COLOR": "1"})
    return r.exit_code, r.stdout, r.stderr


def rows(text: str, field: str) -> list[str]:
    """The lines of one field of the scan tables (the field's row and its continuations)."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) < 4:
            inside = False
            continue
        if cells[1]:
            inside = cells[1] == field
        if inside:
            out.append(cells[2])
    return out


def test_text_marks_held_vgpus_and_counts_what_still_fits() -> None:
    held_by = f"{FREE_A2}=pod vms/virt-launcher-cad"
    code, out, err = run("scan", "--sim", str(SIM / "a2-host.yaml"), "--in-use", held_by)
    assert code == 0, err
    assert rows(out, "held") == [
        f"{HELD_A2}: vm default/win-1",
        f"{FREE_A2}: pod vms/virt-launcher-cad",
        "1 free",
    ]
    # A2 (16 GB): four 4 GB vGPUs at most; three exist, 13 VFs are free.
    assert rows(out, "still fits") == [
        "A2-4A ×1, A2-4C ×1, A2-4Q ×1",
        "(each count alone; 13 free VFs)",
    ]


def test_a_vendor_vfio_gpu_counts_its_framebuffer_not_its_free_vfs() -> None:
    code, out, err = run("scan", "--sim", str(SIM / "mixed.yaml"))
    assert code == 0, err
    fits = rows(out, "still fits")
    # L40S (48 GB) with one L40S-12Q: three more 12 GB vGPUs, though 31 VFs list them.
    assert "L40S-12A ×3, L40S-12C ×3, L40S-12Q ×3" in fits
    assert "(each count alone; 31 free VFs)" in fits
    assert "(on 31 VFs)" not in out


def test_json_has_held_by_and_still_fits() -> None:
    code, out, err = run(
        "scan", "--sim", str(SIM / "a2-host.yaml"), "-o", "json", "--in-use", f"{FREE_A2}=pod x/y"
    )
    assert code == 0, err
    gpu = json.loads(out)["gpus"][0]
    assert {v["uuid"]: v["held_by"] for v in gpu["vgpus"]} == {
        HELD_A2: "vm default/win-1",
        FREE_A2: "pod x/y",
        "3deab9a4-200a-4c54-99b1-5eb0722d1d81": None,
    }
    assert gpu["still_fits"] == [
        {"type": t, "count": 1, "on": "vfs", "free_vfs": 13} for t in ("A2-4A", "A2-4C", "A2-4Q")
    ]


def test_a_gpu_without_vfs_shows_the_drivers_count() -> None:
    code, out, err = run("scan", "--sim", str(SIM / "t4-pair.yaml"), "-o", "json")
    assert code == 0, err
    first = json.loads(out)["gpus"][0]
    # The T4's mdev types are on the GPU itself: available_instances is the driver's count.
    assert sorted(first["still_fits"], key=lambda f: f["type"]) == sorted(
        (
            {"type": t["name"], "count": t["available"], "on": "gpu"}
            for t in first["pf_creatable"]
            if t["available"] > 0
        ),
        key=lambda f: f["type"],
    )
    assert first["still_fits"]


def test_in_use_file_and_proc_root_name_holders_on_a_real_sysfs(tmp_path: Path) -> None:
    """A sysfs tree and a /proc on disk, read as on a host: the QEMU process holding the
    held vGPU is named, and --in-use-file adds a pod."""
    host = SimHost(SIM / "a2-host.yaml", tmp_path / "sys")
    try:
        open_proc(host, str(tmp_path / "proc"))
        listing = tmp_path / "in-use.txt"
        listing.write_text(f"{FREE_A2} pod vms/virt-launcher-cad\n")
        code, out, err = run(
            "scan", "--sysfs-root", host.root, "--proc-root", str(tmp_path / "proc"),
            "--in-use-file", str(listing), "-o", "json",
        )  # fmt: skip
    finally:
        host.close()
    assert code == 0, err
    held = {v["uuid"]: v["held_by"] for v in json.loads(out)["gpus"][0]["vgpus"]}
    assert held[FREE_A2] == "pod vms/virt-launcher-cad"
    assert held[HELD_A2] is not None and held[HELD_A2].startswith("VM default_win-1 (process ")
    assert held["3deab9a4-200a-4c54-99b1-5eb0722d1d81"] is None


def test_an_in_use_key_that_matches_no_vgpu_is_a_warning() -> None:
    code, _, err = run("scan", "--sim", str(SIM / "a2-host.yaml"), "--in-use", "0000:99:00.1=x")
    assert code == 0
    assert "warning: in-use key '0000:99:00.1' (held by x) matches no vGPU on this node" in err
