"""A saved plan is untrusted input: an edited one is refused before any write."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from vgpu_state.cli.main import cli
from vgpu_state.host import driver
from vgpu_state.sim.host import SimHost

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"
T4 = "0000:3b:00.0"
T4_VGPU = "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"
HELD = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Path]:
    """A simulated mixed node and a saved plan for it (1 destroy, 8 creates)."""
    spec = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    plan = tmp_path / "plan.json"
    r = run("plan", "-f", str(CONFIG), "--sim", str(spec), "--out", str(plan))
    assert r.exit_code == 0, r.output
    return spec, plan


def edit(plan: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(plan.read_text())
    change(doc)
    plan.write_text(json.dumps(doc))


def action(doc: dict[str, Any], kind: str, gpu: str | None = None) -> dict[str, Any]:
    for a in doc["plan"]["actions"]:
        if a["kind"] == kind and (gpu is None or a["gpu"] == gpu):
            return dict(a)
    raise AssertionError(f"no {kind} action")


def refused(spec: Path, plan: Path, *fragments: str) -> Result:
    before = spec.read_text()
    r = run("apply", str(plan))
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr
    assert spec.read_text() == before, "the simulated host changed"
    assert not (spec.parent / "node.yaml.journal.jsonl").exists()
    return r


def set_action(
    kind: str, gpu: str | None = None, **fields: Any
) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        actions = doc["plan"]["actions"]
        for i, a in enumerate(actions):
            if a["kind"] == kind and (gpu is None or a["gpu"] == gpu):
                actions[i] = {**a, **fields}
                return
        raise AssertionError(f"no {kind} action")

    return change


def test_a_destroy_whose_uuid_is_a_path_is_refused(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, set_action("destroy", uuid="../../../../x"))
    refused(spec, plan, "plan.actions[2]", "uuid '../../../../x' is not an mdev UUID")


def test_a_create_whose_parent_is_an_absolute_path_is_refused(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, set_action("create", parent="/etc"))
    refused(spec, plan, "plan.actions[0].parent: '/etc' is not a PCI address")


def test_a_vf_create_with_a_path_and_any_type_is_refused(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, set_action("create", "0000:81:00.0", vf="../../../x", parent="../../../x"))
    refused(spec, plan, "plan.actions[7]", "is not a PCI address")
    edit(plan, set_action("create", "0000:81:00.0", type_id="anything"))
    refused(spec, plan, "plan.actions[7].type_id")


def test_an_action_on_a_gpu_that_is_not_scanned_is_refused(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    other = "0000:99:00.0"
    uuid = "00000000-0000-4000-8000-000000000001"

    def change(doc: dict[str, Any]) -> None:
        a = action(doc, "destroy")
        doc["plan"]["actions"][2] = {
            **a,
            "gpu": other,
            "parent": other,
            "uuid": uuid,
            "address": f"gpu[{other}].vgpu[{uuid}]",
        }

    edit(plan, change)
    refused(spec, plan, "plan.actions[2]", f"gpu {other} is not on this host")


def test_a_destroy_of_a_vgpu_the_plan_did_not_choose_is_refused(saved: tuple[Path, Path]) -> None:
    """A valid, existing vGPU swapped in: only re-planning can tell."""
    spec, plan = saved
    other = HELD  # on the A2, kept by the layout

    def change(doc: dict[str, Any]) -> None:
        a = action(doc, "destroy")
        doc["plan"]["actions"][2] = {
            **a,
            "gpu": "0000:08:00.0",
            "uuid": other,
            "parent": "0000:08:00.4",
            "address": f"gpu[0000:08:00.0].vgpu[{other}]",
        }

    edit(plan, change)
    refused(spec, plan, "not what its desired layout gives on this host now")


def test_a_changed_type_id_is_refused(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, set_action("create", T4, type_id=999999))
    refused(spec, plan, "type_id 999999 is not a vGPU type gpu 0000:3b:00.0 offers")


def test_the_address_must_name_the_step(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, set_action("destroy", address=f"gpu[{T4}].vgpu[something-else]"))
    refused(spec, plan, "does not name its step")


def test_in_use_now_blocks_a_saved_destroy(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    before = spec.read_text()
    r = run("apply", str(plan), "--in-use", f"{T4_VGPU.upper()}=vm prod/db")
    assert r.exit_code == 1, r.output
    assert "the vGPU is now held by vm prod/db" in r.stderr
    assert spec.read_text() == before


def test_an_unedited_saved_plan_still_applies(saved: tuple[Path, Path]) -> None:
    _, plan = saved
    r = run("apply", str(plan))
    assert r.exit_code == 0, r.output
    assert "Apply complete: 9 done" in r.output


def test_unknown_fields_of_a_newer_minor_version_are_ignored(saved: tuple[Path, Path]) -> None:
    _, plan = saved

    def newer(doc: dict[str, Any]) -> None:
        doc["plan"]["format_version"] = "1.7"
        doc["plan"]["future"] = {"x": 1}
        for a in doc["plan"]["actions"]:
            a["annotation"] = "new in 1.7"

    edit(plan, newer)
    r = run("apply", str(plan))
    assert r.exit_code == 0, r.output


def test_a_plan_saved_before_the_mode_steps_still_applies(saved: tuple[Path, Path]) -> None:
    """Format 1.6 added steps and fields; a 1.5 plan has none of them and applies."""
    _, plan = saved
    edit(plan, lambda doc: doc["plan"].update(format_version="1.5"))
    r = run("apply", str(plan))
    assert r.exit_code == 0, r.output
    assert "Apply complete: 9 done" in r.output


def test_a_plan_saved_before_the_blast_radius_still_applies(saved: tuple[Path, Path]) -> None:
    _, plan = saved

    def older(doc: dict[str, Any]) -> None:
        doc["plan"]["format_version"] = "1.3"
        for key in ("disruption", "capacity", "affected", "protected"):
            del doc["plan"][key]
        for a in doc["plan"]["actions"]:
            del a["disruption"]

    edit(plan, older)
    r = run("apply", str(plan))
    assert r.exit_code == 0, r.output
    assert "Apply complete: 9 done" in r.output


def test_a_destroy_relabelled_as_harmless_is_refused(saved: tuple[Path, Path]) -> None:
    spec, plan = saved

    def harmless(doc: dict[str, Any]) -> None:
        for a in doc["plan"]["actions"]:
            if a["kind"] == "destroy":
                a["disruption"] = "none"

    edit(plan, harmless)
    refused(
        spec, plan, "plan.actions[2].disruption", "disruption 'none' is not the level of a destroy"
    )


def test_a_disruption_level_that_does_not_exist_is_named(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, lambda doc: doc["plan"]["disruption"].update(level="meh"))
    refused(spec, plan, "plan.disruption.level", "'meh'")


def test_unknown_fields_in_this_version_are_refused(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, lambda doc: doc["plan"]["actions"][0].update(extra=1))
    refused(spec, plan, "plan.actions[0].extra")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe{", "not UTF-8"),
        (b'{"kind": "vgpu-state-saved-plan"}', "missing 'plan'"),
        (b'{"kind": "vgpu-state-saved-plan", "plan": [], "desired": {}, "snapshot": {},'
         b' "in_use": {}, "host": {}}', "plan: expected an object"),
        (b"[" * 100000, "not a saved plan"),
        (b"{}", "not a saved plan"),
        (b"", "not a saved plan"),
    ],
)
def test_malformed_saved_plans_get_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(content)
    r = run("apply", str(plan))
    assert r.exit_code == 1
    assert message in r.stderr
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_wrong_types_in_a_saved_plan_are_named(saved: tuple[Path, Path]) -> None:
    spec, plan = saved
    edit(plan, lambda doc: doc["plan"]["gpus"][0].update(index="zero"))
    refused(spec, plan, "plan.gpus[0].index")
    edit(plan, lambda doc: doc["plan"]["gpus"][0].update(index=0))
    edit(plan, lambda doc: doc.update(in_use=[1, 2]))
    refused(spec, plan, "in_use: expected an object")


def test_a_uuid_that_walks_to_a_pci_device_remove_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a sysfs tree on disk, ``../../pci/devices/<BDF>`` would hot-unplug the GPU."""
    monkeypatch.setenv("VGPU_STATE_LOCK_FILE", str(tmp_path / "lock"))
    monkeypatch.setenv("VGPU_STATE_JOURNAL", str(tmp_path / "journal.jsonl"))
    root = tmp_path / "sys"
    with SimHost(REPO / "configs" / "sim" / "mixed.yaml", root):
        remove = root / "bus" / "pci" / "devices" / T4 / "remove"
        remove.write_text("")
        plan = tmp_path / "plan.json"
        r = run("plan", "-f", str(CONFIG), "-c", "mixed", "--sysfs-root", str(root), "--out",
                str(plan))
        assert r.exit_code == 0, r.output
        edit(plan, set_action("destroy", uuid=f"../../pci/devices/{T4}"))
        r = run("apply", str(plan))
        assert r.exit_code == 1
        assert "is not an mdev UUID" in r.stderr
        assert remove.read_text() == ""


def test_the_driver_refuses_paths_outside_the_root(tmp_path: Path) -> None:
    from vgpu_state.host.paths import UnsafePathError

    root = tmp_path / "sys"
    devices = root / "bus" / "mdev" / "devices"
    devices.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "remove").write_text("")
    uuid = "c728e022-f16f-434b-ad2c-9665ee634d3d"
    (devices / uuid).symlink_to(outside)
    with pytest.raises(UnsafePathError) as info:
        driver.remove_mdev(str(root), uuid)
    assert "outside" in str(info.value)
    assert (outside / "remove").read_text() == ""
    for bad in ("../x", "C728E022-F16F-434B-AD2C-9665EE634D3D", ""):
        with pytest.raises(UnsafePathError):
            driver.remove_mdev(str(root), bad)
    with pytest.raises(UnsafePathError):
        driver.create_mdev(str(root), "/etc", 746, uuid)
    with pytest.raises(UnsafePathError):
        driver.set_vf_type(str(root), "0000:08:00.4/../../..", 746)
    with pytest.raises(UnsafePathError):
        driver.enable_sriov(str(root), "ALL", ("/bin/true",))
