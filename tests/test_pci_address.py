"""GPU and VF addresses are validated ``PciAddress`` values that serialise as plain strings."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tests.builders import build_gpu, build_snapshot, desired
from vgpu_state.catalog import default_catalog
from vgpu_state.model import Gpu, PciAddress
from vgpu_state.model.plan import Plan
from vgpu_state.planner import plan

CATALOG = default_catalog()


def test_an_address_is_canonical_and_a_string() -> None:
    a = PciAddress("3B:00.0")
    assert a == "0000:3b:00.0" and isinstance(a, str) and type(a) is PciAddress
    assert PciAddress(a) is a
    assert {"0000:3b:00.0": 1}[a] == 1


@pytest.mark.parametrize("text", ["", "3b:00", "/etc", "0000:3b:00.8", "gpu0"])
def test_text_that_is_no_address_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a PCI address"):
        PciAddress(text)


def test_snapshot_fields_validate_and_normalise() -> None:
    g = Gpu(index=0, address="3b:00.0", vendor_id=0x10DE, device_id=0x1EB8)
    assert type(g.address) is PciAddress and g.address == "0000:3b:00.0"
    with pytest.raises(ValidationError, match="'x' is not a PCI address"):
        Gpu(index=0, address="x", vendor_id=0x10DE, device_id=0x1EB8)


def test_plans_carry_typed_addresses_and_serialise_plain_strings() -> None:
    snapshot = build_snapshot(build_gpu("0000:08:00.0", "A2"))
    d = desired({"0000:08:00.0": {"A2-4Q": 2}}, snapshot)
    assert type(d.gpus[0].address) is PciAddress
    p = plan(d, snapshot, catalog=CATALOG)
    create = p.actions[0]
    assert type(create.gpu) is PciAddress and type(create.parent) is PciAddress
    assert type(p.gpus[0].address) is PciAddress
    data = json.loads(p.model_dump_json())
    assert data["actions"][0]["gpu"] == "0000:08:00.0"
    assert data["actions"][0]["parent"] == "0000:08:00.4"
    assert type(p.model_dump()["actions"][0]["gpu"]) is str
    assert Plan.model_validate_json(p.model_dump_json()) == p
