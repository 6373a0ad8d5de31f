"""Selection (label > node-selector > default) and resolution of a config onto GPUs."""

from __future__ import annotations

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text, resolve, select
from vgpu_state.model import ConfigError, Gpu, SelectionError

CATALOG = default_catalog()

DOC = """\
version: v1
default: fallback
node-selectors:
  - match-labels: {pool: vdi}
    config: vdi
  - match-expressions:
      - {key: pool, operator: In, values: [ml, batch]}
      - {key: frozen, operator: DoesNotExist}
    config: compute
  - match-expressions:
      - {key: lab, operator: Exists}
      - {key: tier, operator: NotIn, values: [prod]}
    config: lab
vgpu-configs:
  fallback:
    - devices: all
      vgpu-devices: {}
  vdi:
    - devices: all
      device-filter: "0x25B610DE"
      vgpu-devices: {A2-4Q: 4}
    - devices: all
      device-filter: "0x25B610DE"
      vgpu-devices: {A16-2Q: 8}
  compute:
    - devices: all
      vgpu-devices: {L40S-24C: 2}
  lab:
    - devices: [0]
      vgpu-devices: {A2-8Q: 2}
    - devices: ["0000:09:00.0"]
      vgpu-devices: {A16-1Q: 16}
  overlap:
    - devices: all
      vgpu-devices: {A2-4Q: 4}
    - devices: [0]
      device-filter: "0x25B610DE:0x157E10DE"
      vgpu-devices: {A2-4C: 4}
  by-subsystem:
    - devices: all
      device-filter: "0x25B610DE:0x157E10DE"
      vgpu-devices: {NVIDIA A2-2Q: 8}
    - devices: all
      device-filter: "0x25B610DE:0x14A910DE"
      vgpu-devices: {A16-4Q: 4}
"""


def a2(index: int, address: str) -> Gpu:
    return Gpu(
        index=index,
        address=address,
        vendor_id=0x10DE,
        device_id=0x25B6,
        subsystem_vendor_id=0x10DE,
        subsystem_device_id=0x157E,
    )


def a16(index: int, address: str) -> Gpu:
    return Gpu(
        index=index,
        address=address,
        vendor_id=0x10DE,
        device_id=0x25B6,
        subsystem_vendor_id=0x10DE,
        subsystem_device_id=0x14A9,
    )


def l40s(index: int, address: str) -> Gpu:
    return Gpu(
        index=index,
        address=address,
        vendor_id=0x10DE,
        device_id=0x26B9,
        subsystem_vendor_id=0x10DE,
        subsystem_device_id=0x1851,
        model="L40S",
    )


GPUS = (a2(0, "0000:08:00.0"), a16(1, "0000:09:00.0"), l40s(2, "0000:41:00.0"))


@pytest.fixture(scope="module")
def doc():
    return load_text(DOC, "pools.yaml", catalog=CATALOG)


@pytest.mark.parametrize(
    ("labels", "config", "source"),
    [
        ({"nvidia.com/vgpu.config": "lab", "pool": "vdi"}, "lab", "label"),
        ({"pool": "vdi"}, "vdi", "node-selector[0]"),
        ({"pool": "ml"}, "compute", "node-selector[1]"),
        ({"pool": "ml", "frozen": "x"}, "fallback", "default"),
        ({"lab": "", "tier": "dev"}, "lab", "node-selector[2]"),
        ({"lab": "", "tier": "prod"}, "fallback", "default"),
        ({}, "fallback", "default"),
    ],
)
def test_precedence(doc, labels, config, source) -> None:
    selection = select(doc, "n1", labels)
    assert (selection.config, selection.source) == (config, source)


def test_selection_details(doc) -> None:
    assert select(doc, "n1", {"pool": "vdi"}).detail == (
        "first matching node-selector (pools.yaml:4:5)"
    )
    assert select(doc, "n1", {}).detail == "default (pools.yaml:2:10)"
    assert select(doc, "n1", {"nvidia.com/vgpu.config": "vdi"}).detail == (
        "node label nvidia.com/vgpu.config=vdi"
    )


def test_custom_label_key(doc) -> None:
    labels = {"example.com/layout": "compute"}
    assert select(doc, "n1", labels, label_key="example.com/layout").config == "compute"


def test_no_config_selected_is_an_outcome() -> None:
    plain = load_text(
        "version: v1\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices: {}\n",
        "p.yaml",
        catalog=CATALOG,
    )
    selection = select(plain, "n1", {"pool": "x"})
    assert selection.config is None and selection.source == "none"


def test_label_naming_unknown_config_suggests(doc) -> None:
    with pytest.raises(SelectionError) as caught:
        select(doc, "n1", {"nvidia.com/vgpu.config": "compte"})
    assert str(caught.value) == (
        "node n1: label nvidia.com/vgpu.config=compte names no config in pools.yaml; "
        "did you mean compute?"
    )


def test_a2_and_a16_share_a_device_id_types_decide(doc) -> None:
    state = resolve(doc, "vdi", GPUS, "n1", "label", catalog=CATALOG)
    assert [(g.address, g.types) for g in state.gpus] == [
        ("0000:08:00.0", (("A2-4Q", 4),)),
        ("0000:09:00.0", (("A16-2Q", 8),)),
    ]
    assert state.gpus[0].entry == "pools.yaml:19:7 (vgpu-configs.vdi[0])"
    assert state.gpus[1].entry == "pools.yaml:22:7 (vgpu-configs.vdi[1])"
    assert state.unmanaged == ("0000:41:00.0",)
    assert (state.node, state.config, state.selection_source) == ("n1", "vdi", "label")


def test_a2_and_a16_by_subsystem_filter(doc) -> None:
    state = resolve(doc, "by-subsystem", GPUS, "n1", "label", catalog=CATALOG)
    assert [g.types for g in state.gpus] == [(("A2-2Q", 8),), (("A16-4Q", 4),)]
    assert state.gpus[0].model == "A2"


def test_index_and_address(doc) -> None:
    state = resolve(doc, "lab", GPUS, "n1", "node-selector[2]", catalog=CATALOG)
    assert [(g.index, g.types) for g in state.gpus] == [
        (0, (("A2-8Q", 2),)),
        (1, (("A16-1Q", 16),)),
    ]
    assert state.unmanaged == ("0000:41:00.0",)


def test_overlapping_entries_name_both_lines(doc) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(doc, "overlap", GPUS, "n1", "label", catalog=CATALOG)
    assert [str(i) for i in caught.value.issues] == [
        "pools.yaml:36:7: GPU 0000:08:00.0 (index 0) matches two entries of config 'overlap': "
        "[0] on line 34 and [1] on line 36; make their devices or device-filter disjoint "
        "(vgpu-configs.overlap[1])"
    ]


def test_unmanaged_and_empty_layout(doc) -> None:
    state = resolve(doc, "compute", GPUS, "n1", "node-selector[1]", catalog=CATALOG)
    assert [g.address for g in state.gpus] == ["0000:41:00.0"]
    assert state.unmanaged == ("0000:08:00.0", "0000:09:00.0")
    empty = resolve(doc, "fallback", GPUS, "n1", "default", catalog=CATALOG)
    assert [g.types for g in empty.gpus] == [(), (), ()]


def test_unknown_model_accepts_types_as_is() -> None:
    doc = load_text(
        "version: v1\nvgpu-configs:\n  m:\n    - devices: all\n      vgpu-devices: {M60-0Q: 16}\n",
        "m.yaml",
        catalog=CATALOG,
    )
    gpu = Gpu(index=0, address="0000:05:00.0", vendor_id=0x10DE, device_id=0x13F2)
    state = resolve(doc, "m", [gpu], "n1", "default", catalog=CATALOG)
    assert state.gpus[0].types == (("M60-0Q", 16),) and state.gpus[0].model is None


def test_gfx_alias_resolves_to_sysfs_name() -> None:
    doc = load_text(
        "version: v1\nvgpu-configs:\n  m:\n    - devices: all\n"
        "      vgpu-devices: {GRID DC-1-24CGFX: 4}\n",
        "m.yaml",
        catalog=CATALOG,
    )
    gpu = Gpu(index=0, address="0000:05:00.0", vendor_id=0x10DE, device_id=0x2BB5)
    assert resolve(doc, "m", [gpu], "n1", "default", catalog=CATALOG).gpus[0].types == (
        ("DC-1-24C", 4),
    )


def test_policy_flows_into_desired_state() -> None:
    doc = load_text(
        "version: v1\npolicy: {prune: true}\nvgpu-configs:\n  m:\n"
        "    policy: {in-use: ignore}\n    entries:\n      - devices: all\n"
        "        vgpu-devices: {}\n",
        "m.yaml",
        catalog=CATALOG,
    )
    state = resolve(doc, "m", [], "n1", "default", catalog=CATALOG)
    assert state.policy.prune is True and state.policy.in_use == "ignore"


def test_resolve_unknown_config(doc) -> None:
    with pytest.raises(SelectionError, match="did you mean compute"):
        resolve(doc, "comptue", GPUS, "n1", "flag", catalog=CATALOG)


@pytest.mark.parametrize("empty", ['""', "[]", "null", "''", "~"])
def test_empty_device_filter_means_every_gpu(empty: str) -> None:
    """As in vgpu-device-manager: an empty or null device-filter matches every GPU."""
    from tests.builders import NODE, build_gpu, build_snapshot

    text = (
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n"
        f"      device-filter: {empty}\n      vgpu-devices: {{A2-4Q: 4}}\n"
    )
    doc = load_text(text, "f.yaml", catalog=CATALOG)
    assert doc.configs["c"].entries[0].device_filter == ()
    snapshot = build_snapshot(build_gpu("0000:08:00.0", "A2"), build_gpu("0000:09:00.0", "A2"))
    state = resolve(doc, "c", snapshot.gpus, NODE, "flag", catalog=CATALOG)
    assert [g.address for g in state.gpus] == ["0000:08:00.0", "0000:09:00.0"]
    assert state.unmanaged == ()


def test_resolution_covers_gpus_with_a_newer_drivers_type() -> None:
    """The entry applies to the GPU of its family even though the catalog lacks the type."""
    from tests.builders import NODE, build_gpu, build_snapshot

    text = (
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {L40S-5Q: 2}\n"
    )
    doc = load_text(text, "f.yaml", catalog=CATALOG)
    snapshot = build_snapshot(build_gpu("0000:26:00.0", "L40S", layout="vendor-vfio"))
    state = resolve(doc, "c", snapshot.gpus, NODE, "flag", catalog=CATALOG)
    assert [g.types for g in state.gpus] == [(("L40S-5Q", 2),)]
