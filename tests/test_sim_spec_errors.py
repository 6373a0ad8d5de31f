"""A bad simulator spec names the file, line, column and the offending value."""

from __future__ import annotations

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.sim.spec import SpecError, parse_spec

CATALOG = default_catalog()

BAD = """\
node: x
gpus:
  - address: "0000:08:00.0"
    model: A3
    layout: mdevv
    vgpus:
      - {type: A2-4Q, vff: 1}
"""


def test_every_problem_is_reported_with_its_position() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(BAD, "node.yaml", catalog=CATALOG)
    assert str(err.value).splitlines() == [
        "node.yaml:4:12: gpus.0.model: unknown GPU model 'A3'; did you mean 'A30'? (found 'A3')",
        "node.yaml:5:13: gpus.0.layout: Input should be 'mdev' or 'vendor-vfio' (found 'mdevv')",
        "node.yaml:7:23: gpus.0.vgpus.0.vff: Extra inputs are not permitted (found 1)",
    ]


def test_bad_address_and_missing_key() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec('node: x\ngpus:\n  - address: "08:00"\n', "n.yaml", catalog=CATALOG)
    lines = str(err.value).splitlines()
    assert lines[0].startswith("n.yaml:3:14: gpus.0.address: '08:00' is not a PCI address")
    assert lines[1] == "n.yaml:3:5: gpus.0.model: Field required"


def test_not_yaml() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec("node: [x\n", "n.yaml", catalog=CATALOG)
    assert str(err.value).startswith("n.yaml:2:1: not valid YAML")


def test_an_empty_vgpus_key_means_no_vgpus() -> None:
    spec = parse_spec(
        'node: x\ngpus:\n  - {address: "3b:00.0", model: T4, vgpus: }\n', "n.yaml", catalog=CATALOG
    )
    assert spec.gpus[0].vgpus == ()


def test_a_reused_anchor_is_a_located_error() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec("node: &n x\ngpus: &n []\n", "n.yaml", catalog=CATALOG)
    assert str(err.value) == (
        "n.yaml:2:7: anchor &n is already defined on line 1, column 7; "
        "give each anchor its own name"
    )


@pytest.mark.filterwarnings("error")
def test_without_ruamels_c_parser_no_yaml_warning_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on Python builds without ruamel.yaml.clib: ruamel's pure-Python loader only warns
    about a reused anchor and a YAML 1.1 float without a dot; both are located errors here."""
    monkeypatch.setattr("ruamel.yaml.main.CParser", None)
    with pytest.raises(SpecError) as err:
        parse_spec("node: &n x\ngpus: &n []\n", "n.yaml", catalog=CATALOG)
    assert str(err.value).startswith("n.yaml:2:7: anchor &n is already defined on line 1")
    with pytest.raises(SpecError) as err:
        text = "%YAML 1.1\n---\nnode: x\ngpus: []\nextra-pci-devices: 1e3\n"
        parse_spec(text, "n.yaml", catalog=CATALOG)
    assert str(err.value) == (
        "n.yaml:5:20: not valid YAML: under %YAML 1.1 the float '1e3' needs a dot in its "
        "mantissa (such as 1.0e3)"
    )
