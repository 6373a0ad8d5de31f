"""vGPU types are keyed by (GPU model, type name); inferred catalog rows are advisory.

The same name is a type of several models with different limits (``DC-16Q``:
6 per RTX PRO 6000 Blackwell, 2 per RTX PRO 4500 Blackwell, whose rows are
inferred). A config that lays out each model by its device-filter must be
checked against that model's limits, whichever model the table lists last.

The suite's own generated config (one config per catalog model, and a
``default`` over all of them, as NVIDIA vgpu-device-manager's example file is
built) validates and plans on a simulated node with one GPU of every model.
NVIDIA's current example file itself is checked when
``VGPU_STATE_VDM_CONFIG`` names a copy (it is not shipped with the tests).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_state.catalog import Catalog, GpuModel, VgpuType, default_catalog, parse_type_name
from vgpu_state.cli.main import cli
from vgpu_state.cli.validate import gpus_from_flags
from vgpu_state.config import load_text, resolve
from vgpu_state.model.errors import ConfigError
from vgpu_state.model.gpumode import GpuMode

CATALOG = default_catalog()
PRO6000 = "RTX PRO 6000 Blackwell Server Edition"
PRO4500 = "RTX PRO 4500 Blackwell Server Edition (inferred)"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def entry(types: str, device_filter: str | None = None) -> str:
    head = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n"
    extra = f'      device-filter: "{device_filter}"\n' if device_filter else ""
    return f"{head}{extra}      vgpu-devices: {types}\n"


def errors_of(text: str, catalog: Catalog = CATALOG) -> list[str]:
    try:
        load_text(text, "c.yaml", catalog=catalog)
    except ConfigError as exc:
        return [f"{i.line}:{i.column}: {i.message}" for i in exc.issues]
    return []


def warnings_of(text: str, catalog: Catalog = CATALOG) -> list[str]:
    doc = load_text(text, "c.yaml", catalog=catalog)
    return [f"{i.line}:{i.column}: {i.message}" for i in doc.warnings]


# the catalog ------------------------------------------------------------------------


def test_one_name_two_models_two_limits() -> None:
    limits = {t.model: t.max_instances for t in CATALOG.types_named("DC-16Q")}
    assert limits == {PRO6000: 6, PRO4500: 2}
    assert CATALOG.type("DC-16Q") is None  # a bare name does not say whose limits
    assert CATALOG.type("DC-16Q", PRO6000).max_instances == 6  # type: ignore[union-attr]
    assert CATALOG.type("NVIDIA DC-16Q", PRO4500).max_instances == 2  # type: ignore[union-attr]
    assert CATALOG.knows("DC-16Q") and not CATALOG.knows("DC-17Q")
    assert [m.name for m in CATALOG.models_offering("DC-16Q")] == [PRO6000, PRO4500]
    pro4500 = CATALOG.model(PRO4500)
    assert pro4500 is not None and pro4500.inferred
    assert not CATALOG.model(PRO6000).inferred  # type: ignore[union-attr]
    # Messages name the model where its short name (DC) is shared.
    assert CATALOG.label(pro4500) == PRO4500
    assert CATALOG.label(CATALOG.find_model("T4")) == "T4"  # type: ignore[arg-type]
    assert CATALOG.find_model("DC") is None


# validate against the shipped catalog -----------------------------------------------


@pytest.mark.parametrize(
    ("types", "device_filter"),
    [
        pytest.param("{DC-16Q: 6}", "0x2BB510DE", id="pro6000-at-its-limit"),
        pytest.param("{DC-16Q: 2}", "0x2C3A10DE", id="pro4500-at-its-limit"),
        # vgpu-device-manager's files lay out the bigger GPU without a filter.
        pytest.param("{DC-16Q: 6}", None, id="no-filter-fits-one-model"),
    ],
)
def test_shared_name_is_checked_against_the_selected_model(
    types: str, device_filter: str | None
) -> None:
    text = entry(types, device_filter)
    assert errors_of(text) == []
    assert warnings_of(text) == []


def test_over_the_limit_of_a_tabled_model_is_an_error_naming_it() -> None:
    assert errors_of(entry("{DC-16Q: 7}", "0x2BB510DE")) == [
        f"6:30: DC-16Q: 7 exceeds 6, the most one {PRO6000} holds"
    ]
    # No model fits 7 and one of them is tabled: still not an error-free file.
    assert errors_of(entry("{DC-16Q: 7}")) == []
    assert any("exceeds 6" in w for w in warnings_of(entry("{DC-16Q: 7}")))


def test_inferred_model_is_advisory() -> None:
    over = entry("{DC-16Q: 3}", "0x2C3A10DE")
    assert errors_of(over) == []
    assert warnings_of(over) == [
        f"6:30: DC-16Q: 3 exceeds 2, the most one {PRO4500} holds "
        f"({PRO4500}'s catalog rows are inferred; the node's driver decides)"
    ]
    lacking = entry("{DC-8Q: 4}", "0x2C3A10DE")
    assert errors_of(lacking) == []
    assert warnings_of(lacking) == [
        f"6:22: DC-8Q is not among the catalog's types of {PRO4500}, whose rows are "
        "inferred (incomplete); the node's driver decides whether it offers it"
    ]
    # A type of another product is still an error, inferred rows or not.
    assert errors_of(entry("{A2-4Q: 1}", "0x2C3A10DE")) == [
        f"5:22: device-filter '0x2C3A10DE' selects {PRO4500}, but A2-4Q is a type of A2"
    ]


def test_strict_turns_the_inferred_warning_into_an_error(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(entry("{DC-8Q: 4}", "0x2C3A10DE"))
    code, _, err = run("validate", "-f", str(config))
    assert code == 0 and f"warning: DC-8Q is not among the catalog's types of {PRO4500}" in err
    assert run("validate", "--strict", "-f", str(config))[0] == 1


# two tabled models sharing a name ---------------------------------------------------


def _model(name: str, device: int, limit: int) -> GpuModel:
    t = VgpuType("X-8Q", name, "Q", 8192, limit, 900 + device % 100, True)
    return GpuModel(name, (device,), 8192 * limit, types=(t,))


def test_two_tabled_models_sharing_a_name_whichever_is_listed_last() -> None:
    for order in ((0, 1), (1, 0)):
        models = (_model("Big", 0x1111, 4), _model("Small", 0x2222, 2))
        cat = Catalog(tuple(models[i] for i in order))
        assert errors_of(entry("{X-8Q: 4}", "0x111110DE"), cat) == []
        assert errors_of(entry("{X-8Q: 2}", "0x222210DE"), cat) == []
        assert errors_of(entry("{X-8Q: 3}", "0x222210DE"), cat) == [
            "6:28: X-8Q: 3 exceeds 2, the most one Small holds"
        ]
        assert errors_of(entry("{X-8Q: 4}"), cat) == []  # fits Big
        assert len(errors_of(entry("{X-8Q: 5}"), cat)) == 1  # fits neither


# the project's own generated config over every catalog model ------------------------


def _chosen(model: GpuModel) -> tuple[VgpuType, int]:
    """A type of the model and a count its GPU (and its VFs) hold."""
    sliced = [t for t in model.types if not t.is_mig]
    pool = sliced or list(model.types)
    t = max(pool, key=lambda t: (t.framebuffer_mib * 2 <= model.framebuffer_mib, t.max_instances))
    count = t.max_instances
    if model.sriov_capable:
        count = min(count, model.sriov_totalvfs)
    return t, max(count, 1)


def _filters(model: GpuModel) -> list[str]:
    out = []
    for device in model.device_ids:
        base = f"0x{device:04X}10DE"
        shared = len(CATALOG.models_for_device(device)) > 1
        if shared and model.subsystem_device_ids:
            out += [f"{base}:0x{sub:04X}10DE" for sub in model.subsystem_device_ids]
        else:
            out.append(base)
    return out


def generated_config() -> str:
    """One config per model (by device-filter), one ``default`` over every model, and
    a ``DC-16Q`` config without a filter as vgpu-device-manager's file has it."""
    lines = ["version: v1", "vgpu-configs:"]
    default = ["  default:"]
    for i, model in enumerate(CATALOG.models):
        t, count = _chosen(model)
        filters = ", ".join(f'"{f}"' for f in _filters(model))
        body = [
            "    - devices: all",
            f"      device-filter: [{filters}]",
            f"      vgpu-devices: {{{t.name}: {count}}}",
        ]
        lines += [f"  model-{i}:", *body]
        default += body
    lines += default
    lines += ["  DC-16Q:", "    - devices: all", "      vgpu-devices: {DC-16Q: 6}"]
    return "\n".join(lines) + "\n"


def node_spec(models: list[GpuModel]) -> str:
    lines = ["node: every-model", "gpus:"]
    for i, model in enumerate(models):
        lines += [f'  - address: "0000:{i + 1:02x}:00.0"', f'    model: "{model.name}"']
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("generated") / "config.yaml"
    path.write_text(generated_config())
    return path


def test_generated_config_over_every_model_validates(generated: Path) -> None:
    code, out, err = run("validate", "--strict", "-f", str(generated))
    assert (code, err) == (0, ""), err
    assert f"valid: {len(CATALOG.models) + 2} configs" in out


def test_generated_default_plans_on_a_node_with_every_model(
    generated: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(node_spec(list(CATALOG.models)))
    code, out, err = run("plan", "-f", str(generated), "-c", "default", "--sim", str(spec))
    assert code == 0, err
    created = sum(_chosen(m)[1] for m in CATALOG.models)
    assert out.rstrip().endswith(f"Plan: {created} to create, 0 to destroy, 0 blocked.")
    for i, model in enumerate(CATALOG.models):
        assert f"# gpu[0000:{i + 1:02x}:00.0] {model.name} (index {i}," in out


@pytest.mark.parametrize(("model", "limit"), [(PRO6000, 6), (PRO4500, 2)])
def test_shared_name_plans_with_the_node_models_limit(
    generated: Path, tmp_path: Path, model: str, limit: int
) -> None:
    m = CATALOG.model(model)
    assert m is not None
    spec = tmp_path / "node.yaml"
    spec.write_text(node_spec([m]))
    i = CATALOG.models.index(m)
    code, out, err = run("plan", "-f", str(generated), "-c", f"model-{i}", "--sim", str(spec))
    assert code == 0, err
    assert "Plan: " in out
    # The unfiltered DC-16Q: 6 is the RTX PRO 6000's layout; the 4500 holds 2.
    code, out, err = run("plan", "-f", str(generated), "-c", "DC-16Q", "--sim", str(spec))
    if limit >= 6:
        assert code == 0, err
        assert out.rstrip().endswith("Plan: 6 to create, 0 to destroy, 0 blocked.")
    else:
        assert code == 1
        assert f"({model}): 6 × DC-16Q requested but one GPU holds at most {limit}" in err


# NVIDIA's own example file ----------------------------------------------------------

VDM_CONFIG = os.environ.get("VGPU_STATE_VDM_CONFIG", "")


@pytest.mark.skipif(
    not VDM_CONFIG,
    reason="VGPU_STATE_VDM_CONFIG does not name a copy of vgpu-device-manager's "
    "examples/config-example.yaml",
)
def test_vgpu_device_manager_example_config(tmp_path: Path) -> None:
    # Every type of NVIDIA's file is in the catalog: it validates under --strict, and
    # each MIG-backed entry (one type under devices: all) gets GPU instances, with a
    # note (never an error) that they are inferred.
    code, out, err = run("validate", "--strict", "-f", VDM_CONFIG)
    assert code == 0, err
    document = load_text(Path(VDM_CONFIG).read_text(), "f.yaml", catalog=CATALOG, strict=True)
    assert document.warnings == ()
    mig_entries = [
        f"vgpu-configs.{name}[{i}]"
        for name, config in document.configs.items()
        for i, e in enumerate(config.entries)
        if any((p := parse_type_name(t)) is not None and p.is_mig for t in e.vgpu_devices)
    ]
    assert len(mig_entries) > 200
    assert sorted(n.path for n in document.notes) == sorted(mig_entries)
    assert all(
        n.message.startswith("experimental: inferred, not verified on hardware: MIG-backed ")
        for n in document.notes
    )
    assert len(err.splitlines()) == len(mig_entries)
    assert out.strip().endswith(f"configs ({len(mig_entries)} notes)")
    # A MIG-backed config resolves to the GPU instances its types need, without new keys.
    gpus = gpus_from_flags([f"3b:00.0={PRO6000}"])
    state = resolve(document, "DC-1-24Q", gpus, "n", "label", CATALOG)
    assert [(g.mode, g.mig_geometry, g.types) for g in state.gpus] == [
        (GpuMode.MIG, (("1g.24gb", 4),), (("DC-1-24Q", 4),))
    ]
    state = resolve(document, "DC-1-12CGFX", gpus, "n", "label", CATALOG)
    assert [g.mig_geometry for g in state.gpus] == [(("1g.24gb", 4),)]
    spec = tmp_path / "node.yaml"
    spec.write_text(node_spec([CATALOG.model(PRO4500), CATALOG.model(PRO6000)]))  # type: ignore[list-item]
    code, out, err = run("plan", "-f", VDM_CONFIG, "-c", "default", "--sim", str(spec))
    assert code == 0, err
    assert "DC-16Q" in out
    # A MIG-backed config of the file plans on a simulated node of that model.
    mig_node = tmp_path / "mig-node.yaml"
    mig_node.write_text(
        f'node: n\nnvidia-smi: true\ngpus:\n  - address: "0000:3b:00.0"\n'
        f"    model: {PRO6000}\n    layout: vendor-vfio\n"
    )
    code, out, err = run("plan", "-f", VDM_CONFIG, "-c", "DC-1-24Q", "--sim", str(mig_node))
    assert code == 0, err
    assert "MIG mode: off → on" in out
    assert out.count("create GPU instance 1g.24gb") == 4
    assert "experimental: inferred, not verified on hardware" in out
