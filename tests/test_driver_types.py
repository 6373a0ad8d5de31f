"""The driver decides which vGPU types exist; the catalog advises.

A type the catalog lacks is a warning in ``validate`` (an error under
``--strict``) and plans from what the host's driver lists; a type the host does
not offer is a planning error that lists what it offers; a type id that neither
the host nor the catalog gave is never printed or used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.builders import NODE, build_gpu, build_snapshot
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import load_text
from vgpu_state.model.desired import DesiredGpu, DesiredState
from vgpu_state.model.errors import PlanningError
from vgpu_state.model.plan import ActionKind
from vgpu_state.model.snapshot import CreatableType, OfferedType
from vgpu_state.planner import plan
from vgpu_state.render import render_text
from vgpu_state.sim.spec import SpecError, parse_spec

CATALOG = default_catalog()


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def one_entry(types: str, extra: str = "") -> str:
    head = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n"
    return f"{head}{extra}      vgpu-devices: {types}\n"


# validate ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("types", "warning"),
    [
        pytest.param(
            "{L40S-5Q: 2}",
            "vGPU type 'L40S-5Q' is not in the catalog's L40S types",
            id="newer-driver-type-of-a-known-model",
        ),
        pytest.param(
            "{A10-5Q: 1}",
            "vGPU type 'A10-5Q' is not in the catalog's A10 types",
            id="series-the-catalog-lists-size-it-does-not",
        ),
        pytest.param(
            "{T4-1B: 16}",
            "vGPU type 'T4-1B' is not in the catalog's T4 types",
            id="series-the-catalog-lacks",
        ),
        pytest.param(
            "{M60-0Q: 1}",
            "vGPU type 'M60-0Q' is not in the catalog; the node's driver decides",
            id="product-the-catalog-lacks",
        ),
        pytest.param(
            "{T4-2B4: 1}",
            "vGPU type 'T4-2B4' is not in the catalog",
            id="older-b4-form",
        ),
    ],
)
def test_uncatalogued_type_is_a_warning_and_an_error_under_strict(
    tmp_path: Path, types: str, warning: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(one_entry(types))
    code, out, err = run("validate", "-f", str(config))
    assert code == 0, err
    assert out.strip() == f"{config}: valid: 1 config (1 warning)"
    assert f"{config}:5:22: warning: {warning}" in err
    code, out, err = run("validate", "-f", str(config), "--strict")
    assert code == 1
    assert out == ""
    assert f"{config}:5:22: {warning}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("types", "extra", "error"),
    [
        pytest.param(
            "{xyz: 1}", "", "unknown vGPU type 'xyz': not a vGPU type name", id="does-not-parse"
        ),
        pytest.param(
            "{A1O-4Q: 1}", "", "unknown vGPU type 'A1O-4Q'; did you mean A10-4Q?", id="misspelt"
        ),
        pytest.param(
            "{A2-3Q: 1}",
            '      device-filter: "0x1EB810DE"\n',
            "selects T4, but A2-3Q is a type of A2",
            id="wrong-family-for-the-filter",
        ),
        pytest.param(
            "{A2-4Q: 1, A2-3Q: 1}",
            "",
            "A2-4Q (4096 MiB) and A2-3Q (3072 MiB) in one entry",
            id="mixed-sizes",
        ),
        pytest.param(
            "{A2-4Q: 5}", "", "A2-4Q: 5 exceeds 4, the most one A2 holds", id="impossible-count"
        ),
        pytest.param(
            '{" A100-5C": 1}',
            "",
            "vGPU type ' A100-5C' has stray spaces; did you mean A100-5C?",
            id="stray-spaces",
        ),
        pytest.param(
            '{"A100- 1-5C": 1}',
            "",
            "vGPU type 'A100- 1-5C' has a malformed product part (a space inside the name); "
            "did you mean A100-1-5C?",
            id="malformed-product",
        ),
    ],
)
def test_what_stays_an_error_without_strict(
    tmp_path: Path, types: str, extra: str, error: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(one_entry(types, extra))
    code, _, err = run("validate", "-f", str(config))
    assert code == 1
    assert error in err
    assert "warning" not in err


def test_product_prefixes_still_load_without_warning() -> None:
    doc = load_text(one_entry('{"NVIDIA A2-4Q": 1}'), "f.yaml", catalog=CATALOG)
    assert doc.warnings == ()


# planning from the host's lists -------------------------------------------------------


def _desired(address: str, types: dict[str, int]) -> DesiredState:
    return DesiredState(
        node=NODE,
        config="c",
        selection_source="flag",
        gpus=(DesiredGpu(address=address, index=0, types=tuple(sorted(types.items()))),),
    )


def _t4_with(offered: tuple[OfferedType, ...], complete: bool = True) -> object:
    g = build_gpu("0000:3b:00.0", "T4")
    listed = tuple(CreatableType(type_id=t.type_id, name=t.name, available=4) for t in offered)
    return build_snapshot(
        g.model_copy(
            update={
                "offered": offered,
                "offered_complete": complete,
                "pf_creatable": g.pf_creatable + listed,
            }
        )
    )


T4_LISTS = (
    OfferedType(type_id=230, name="T4-1Q", framebuffer_mib=1024, max_instances=16),
    OfferedType(type_id=231, name="T4-2Q", framebuffer_mib=2048, max_instances=8),
    OfferedType(type_id=222, name="T4-16Q", framebuffer_mib=16384, max_instances=1),
)


def test_type_the_catalog_lacks_plans_with_the_drivers_id_size_and_count() -> None:
    offered = (
        *T4_LISTS,
        OfferedType(type_id=9001, name="T4-1B", framebuffer_mib=1024, max_instances=16),
    )
    snapshot = _t4_with(offered)
    p = plan(_desired("0000:3b:00.0", {"T4-1B": 16}), snapshot, catalog=CATALOG)  # type: ignore[arg-type]
    creates = [a for a in p.actions if a.kind is ActionKind.CREATE]
    assert len(creates) == 16
    assert {a.type_id for a in creates} == {9001}
    with pytest.raises(PlanningError, match="one GPU holds at most 16"):
        plan(_desired("0000:3b:00.0", {"T4-1B": 17}), snapshot, catalog=CATALOG)  # type: ignore[arg-type]


def test_type_the_host_does_not_offer_names_what_it_offers_by_size_then_name() -> None:
    snapshot = _t4_with(T4_LISTS)
    with pytest.raises(PlanningError) as caught:
        plan(_desired("0000:3b:00.0", {"T4-1B": 16}), snapshot, catalog=CATALOG)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "gpu[0000:3b:00.0] (Tesla T4): the driver does not offer T4-1B []; "
        "it offers: T4-1Q, T4-2Q, T4-16Q"
    )


def test_never_a_type_id_that_neither_host_nor_catalog_gave() -> None:
    # L40S-12C has no known id in the catalog; with SR-IOV off the host lists nothing yet.
    snapshot = build_snapshot(
        build_gpu("0000:26:00.0", "L40S", layout="vendor-vfio", sriov_on=False)
    )
    p = plan(_desired("0000:26:00.0", {"L40S-12C": 2}), snapshot, catalog=CATALOG)
    creates = [a for a in p.actions if a.kind is ActionKind.CREATE]
    assert [a.type_id for a in creates] == [None, None]
    text = render_text(p)
    assert "type: L40S-12C   " in text
    assert "(id " not in text
    assert "5010" not in json.dumps(p.model_dump(mode="json"))


# end to end on a simulated node ------------------------------------------------------

NEWER_DRIVER = """\
node: l40s-node
driver:
  flavour: all
  extra-types:
    - {name: L40S-5Q, id: 2301, framebuffer-mib: 5120, max-instances: 9}
gpus:
  - address: "0000:26:00.0"
    model: L40S
    layout: vendor-vfio
"""

OLDER_DRIVER = """\
node: l40s-node
gpus:
  - address: "0000:26:00.0"
    model: L40S
    layout: vendor-vfio
"""


def test_newer_drivers_type_validates_with_a_warning_and_applies(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(NEWER_DRIVER)
    config = tmp_path / "c.yaml"
    config.write_text(one_entry("{L40S-5Q: 2}"))
    code, _, err = run("validate", "-f", str(config))
    assert code == 0 and "warning: vGPU type 'L40S-5Q' is not in the catalog" in err
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    code, out, err = run("apply", *args, "--auto-approve")
    assert code == 0, err
    assert "type: L40S-5Q (id 2301)" in out
    assert "Plan: 2 to create, 0 to destroy, 0 blocked." in out
    code, out, _ = run("assert", *args)
    assert (code, out.strip()) == (0, 'The node matches configuration "c" (-c c).')
    code, out, _ = run("plan", *args, "--detailed-exitcode")
    assert code == 0 and 'No changes. The node matches configuration "c".' in out


def test_host_without_the_type_fails_the_plan_naming_what_it_offers(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(OLDER_DRIVER)
    config = tmp_path / "c.yaml"
    config.write_text(one_entry("{L40S-5Q: 9}"))
    for command in ("plan", "apply"):
        code, _, err = run(
            command,
            "-f",
            str(config),
            "-c",
            "c",
            "--sim",
            str(spec),
            *(["--auto-approve"] if command == "apply" else []),
        )
        assert code == 1
        assert "gpu[0000:26:00.0] (L40S): the driver does not offer L40S-5Q" in err
        assert "it offers: L40S-1A, L40S-1B, L40S-1Q, L40S-2A, L40S-2B," in err
        assert "L40S-8Q, L40S-12A, L40S-12C, L40S-12Q" in err
        assert "Traceback" not in err
    assert "vgpus" not in spec.read_text()  # nothing was created


@pytest.mark.parametrize(
    ("types", "message"),
    [
        pytest.param(
            "[{name: L40S-8Q, id: 3000, framebuffer-mib: 8192, max-instances: 6}]",
            "driver.extra-types[0].name: L40S already has a type L40S-8Q",
            id="catalog-name",
        ),
        pytest.param(
            "[{name: L40S-5Q, id: 1152, framebuffer-mib: 5120, max-instances: 9}]",
            "driver.extra-types[0].id: L40S already has a type with id 1152",
            id="catalog-id",
        ),
        pytest.param(
            "[{name: Q9-5Q, id: 3000, framebuffer-mib: 5120, max-instances: 9}]",
            "driver.extra-types[0].model: no GPU model has types named Q9-…",
            id="unknown-family",
        ),
    ],
)
def test_sim_extra_types_are_checked(tmp_path: Path, types: str, message: str) -> None:
    from vgpu_state.sim.driver_model import SimDriver

    spec = parse_spec(f"driver:\n  extra-types: {types}\ngpus: []\n", catalog=CATALOG)
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SimDriver(spec, catalog=CATALOG)


def test_sim_extra_type_needs_a_type_name() -> None:
    with pytest.raises(SpecError, match="is not a vGPU type name"):
        parse_spec(
            "driver:\n  extra-types: [{name: 'L40S 5Q', id: 1, framebuffer-mib: 5120, "
            "max-instances: 9}]\n", catalog=CATALOG
        )


def test_type_id_unlisted_while_other_sizes_stay_is_read_from_the_driver_after_destroys(
    tmp_path: Path,
) -> None:
    """The lists show only 1 GB types while a 1 GB vGPU exists; the plan shows no id for
    the L40S-12C creates, and apply reads it from the driver once the destroy ran."""
    spec = tmp_path / "node.yaml"
    spec.write_text(OLDER_DRIVER + "    vgpus:\n      - {type: L40S-1B, vf: 0}\n")
    config = tmp_path / "c.yaml"
    config.write_text(one_entry("{L40S-12C: 2}"))  # its id is not in the catalog
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    code, out, err = run("plan", *args)
    assert code == 0, err
    assert "type: L40S-12C   vf: 0000:26:00.4" in out
    assert "(id " not in out
    code, out, err = run("apply", *args, "--auto-approve")
    assert code == 0, err
    code, out, _ = run("assert", *args)
    assert code == 0, out


@pytest.mark.parametrize(
    ("name", "warning", "suggested"),
    [
        # A newer driver's type of a known GPU: a warning, the same-size neighbours offered.
        ("A2-3Q", True, "did you mean A2-2Q or A2-4Q?"),
        # Not a type name at all: an error, with the same rule's suggestion.
        ("A2-4G", False, "did you mean A2-4Q, A2-4A or A2-4C?"),
        ("A10_4Q", False, "did you mean A10-4Q?"),
        # Nothing of that product in the catalog, or nothing close: no suggestion.
        ("M60-0Q", True, None),
        ("xyz", False, None),
        ("A2-1234Q", True, None),
    ],
)
def test_one_suggestion_rule_for_unknown_type_names(
    name: str, warning: bool, suggested: str | None
) -> None:
    from vgpu_state.config.typenames import type_name_note

    note = type_name_note(name, CATALOG)
    assert note is not None and note.warning is warning
    if suggested is None:
        assert "did you mean" not in note.message, note.message
    else:
        assert suggested in note.message, note.message
    # Never the old "nearest" of another size.
    assert "nearest" not in note.message and "A2-8Q" not in note.message
