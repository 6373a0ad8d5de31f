"""An entry's GPU mode (``mode``, ``mig-geometry``): what a node's GPUs resolve to, the
file round trip, the schema, ``validate -o json`` and what ``export`` writes."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from click.testing import CliRunner
from ruamel.yaml import YAML

from tests.builders import V, build_gpu, build_snapshot
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.cli.validate import gpus_from_flags
from vgpu_state.config import load_text, resolve
from vgpu_state.config.dump import dump
from vgpu_state.config.export import export_document
from vgpu_state.model.errors import ConfigError
from vgpu_state.model.gpumode import GpuInstance, GpuMode, GpuModes

CATALOG = default_catalog()
SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "vgpu-state-config.schema.json"
PRO6000 = "RTX PRO 6000 Blackwell Server Edition"

LAYOUTS = """\
version: v1
vgpu-configs:
  mig:
    - devices: all
      device-filter: "0x2BB510DE"
      vgpu-devices: {DC-1-24Q: 4}
  geometry:
    - devices: all
      mig-geometry: {1g.24gb: 2, 2g.48gb: 1}
      vgpu-devices: {DC-1-12Q: 3, DC-1-12C: 1, DC-2-24Q: 2}
  mixed:
    - devices: all
      mode: mixed-size
      vgpu-devices: {L40S-24Q: 1, L40S-12Q: 2}
  mig-on-no-vgpus:
    - devices: all
      mode: mig
      mig-geometry: {1g.24gb: 4}
      vgpu-devices: {}
  plain:
    - devices: all
      vgpu-devices: {L40S-12Q: 4}
"""


def test_an_entry_resolves_to_the_gpus_mode_and_gpu_instances() -> None:
    document = load_text(LAYOUTS, "l.yaml", catalog=CATALOG, strict=True)
    pro = gpus_from_flags([f"3b:00.0={PRO6000}"])
    l40s = gpus_from_flags(["3b:00.0=L40S"])

    def one(config: str, gpus: tuple[object, ...]) -> tuple[GpuMode, tuple[tuple[str, int], ...]]:
        state = resolve(document, config, gpus, "n", "label", CATALOG)  # type: ignore[arg-type]
        assert len(state.gpus) == 1
        return state.gpus[0].mode, state.gpus[0].mig_geometry

    assert one("mig", pro) == (GpuMode.MIG, (("1g.24gb", 4),))
    assert one("geometry", pro) == (GpuMode.MIG, (("1g.24gb", 2), ("2g.48gb", 1)))
    assert one("mig-on-no-vgpus", pro) == (GpuMode.MIG, (("1g.24gb", 4),))
    assert one("mixed", l40s) == (GpuMode.MIXED_SIZE, ())
    assert one("plain", l40s) == (GpuMode.TIME_SLICED, ())
    # The default mode is left out of the desired state's JSON (golden outputs stay).
    state = resolve(document, "plain", l40s, "n", "label", CATALOG)
    assert "mode" not in state.gpus[0].model_dump(mode="json")
    assert "mig_geometry" not in state.gpus[0].model_dump(mode="json")


def test_notes_say_which_entries_rest_on_an_inferred_rule() -> None:
    document = load_text(LAYOUTS, "l.yaml", catalog=CATALOG, strict=True)
    assert [(n.line, n.path) for n in document.notes] == [
        (4, "vgpu-configs.mig[0]"),
        (8, "vgpu-configs.geometry[0]"),
        (12, "vgpu-configs.mixed[0]"),
        (16, "vgpu-configs.mig-on-no-vgpus[0]"),
    ]
    assert document.notes[1].message == (
        "experimental: inferred, not verified on hardware: MIG-backed vGPUs in GPU "
        "instances 1g.24gb: 2, 2g.48gb: 1 (mig-geometry); the GPU instance profiles and "
        "how many fit one GPU are derived from the catalog's type limits"
    )
    assert document.warnings == ()


def test_the_keys_round_trip_and_pass_the_schema() -> None:
    document = load_text(LAYOUTS, "l.yaml", catalog=CATALOG)
    again = load_text(dump(document), "again.yaml", catalog=CATALOG)
    assert again == document
    entry = document.configs["geometry"].entries[0]
    assert entry.mode is None and entry.mig_geometry == {"1g.24gb": 2, "2g.48gb": 1}
    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(YAML(typ="safe", pure=True).load(LAYOUTS), schema)
    bad = YAML(typ="safe", pure=True).load(LAYOUTS.replace("mode: mixed-size", "mode: mixed"))
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("the schema accepts mode: mixed")


def test_validate_json_lists_the_notes(tmp_path: Path) -> None:
    path = tmp_path / "l.yaml"
    path.write_text(LAYOUTS)
    result = CliRunner().invoke(cli, ["validate", "-f", str(path), "--strict", "-o", "json"])
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["valid"] is True and out["warnings"] == [] and len(out["notes"]) == 4
    assert out["notes"][0].startswith(
        f"{path}:4:7: note: experimental: inferred, not verified on hardware: "
    )


def test_export_writes_the_mode_and_gpu_instances_a_node_shows() -> None:
    mixed = build_gpu("0000:3b:00.0", "L40S", layout="vendor-vfio", vgpus=[V("L40S-24Q", 0)])
    mixed = mixed.model_copy(
        update={
            "vgpus": (
                *mixed.vgpus,
                mixed.vgpus[0].model_copy(update={"type_name": "L40S-12Q", "type_id": 1153}),
            )
        }
    )
    document = export_document(build_snapshot(mixed), "live")
    [entry] = document.configs["live"].entries
    assert entry.mode is GpuMode.MIXED_SIZE and entry.mig_geometry is None
    gi = GpuInstance(id=1, profile="1g.24gb", placement_start=0, placement_size=1)
    mig = build_gpu("0000:3b:00.0", "L40S", layout="vendor-vfio").model_copy(
        update={
            "model": PRO6000,
            "modes": GpuModes(mig=True, heterogeneous=None, gpu_instances=(gi, gi)),
        }
    )
    [entry] = export_document(build_snapshot(mig), "live").configs["live"].entries
    assert entry.mode is GpuMode.MIG and entry.mig_geometry == {"1g.24gb": 2}
    plain = build_gpu("0000:3b:00.0", "L40S", layout="vendor-vfio", vgpus=[V("L40S-24Q", 0)])
    [entry] = export_document(build_snapshot(plain), "live").configs["live"].entries
    assert entry.mode is None and entry.mig_geometry is None


def test_an_entry_without_types_checks_its_mode_on_the_device_filters_model() -> None:
    def issues(entry: str) -> list[str]:
        text = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      " + entry.replace(
            "\n", "\n      "
        )
        try:
            document = load_text(text + "\n", "f.yaml", catalog=CATALOG)
        except ConfigError as exc:
            return [str(i) for i in exc.issues]
        return [f"note: {n.message}" for n in document.notes]

    pro = 'device-filter: "0x2BB510DE"\nvgpu-devices: {}\nmode: mig\n'
    assert issues(pro + "mig-geometry: {1g.24gb: 4}") == [
        "note: experimental: inferred, not verified on hardware: MIG-backed vGPUs in GPU "
        "instances 1g.24gb: 4 (mig-geometry); the GPU instance profiles and how many fit "
        "one GPU are derived from the catalog's type limits"
    ]
    assert issues(pro + "mig-geometry: {1g.24gb: 5}") == [
        f"f.yaml:8:21: mig-geometry: 5 × 1g.24gb exceed 4, the most one {PRO6000} holds "
        "(vgpu-configs.c[0].mig-geometry)"
    ]
    assert issues('device-filter: "0x223610DE"\nvgpu-devices: {}\nmode: mig') == [
        "f.yaml:7:13: mode: mig: the A10 has no MIG-backed vGPU types (vgpu-configs.c[0].mode)"
    ]
    assert issues('device-filter: "0x223610DE"\nvgpu-devices: {}\nmode: mixed-size') == [
        "f.yaml:7:13: mode: mixed-size: the A10 has no mixed-size mode (the driver has it "
        "for Ada, Hopper and Blackwell GPUs, by inference) (vgpu-configs.c[0].mode)"
    ]
    assert issues("vgpu-devices: {}\nmode: mig\nmig-geometry: {1g.24gb: 4}")[0].endswith(
        "type limits (no device-filter names the GPU model: not checked)"
    )
