# ruff: noqa: E501
"""Invalid config documents: every case asserts the exact messages and their line:column."""

from __future__ import annotations

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text
from vgpu_state.model import ConfigError

CATALOG = default_catalog()

H = "version: v1\nvgpu-configs:\n"


def one(entry: str) -> str:
    """A document with one config ``c`` whose only entry is ``entry`` (YAML lines)."""
    return H + "  c:\n    - " + entry.replace("\n", "\n      ") + "\n"


CASES: list[tuple[str, str, list[str]]] = [
    (
        "not_yaml",
        "version: v1\nvgpu-configs: [\n",
        [
            "3:1: not valid YAML: while parsing a flow node, expected the node content, but found '<stream end>'"
        ],
    ),
    (
        "empty",
        "",
        ["1:1: the file is empty; expected a mapping with version: v1 and vgpu-configs"],
    ),
    (
        "comment_only",
        "# nothing\n",
        ["1:1: the file is empty; expected a mapping with version: v1 and vgpu-configs"],
    ),
    (
        "top_list",
        "- a\n- b\n",
        ["1:1: expected a mapping at the top level, found a list"],
    ),
    (
        "top_scalar",
        "hello\n",
        ["1:1: expected a mapping at the top level, found 'hello'"],
    ),
    (
        "missing_version",
        "vgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["1:1: missing key 'version'; add version: v1 (version)"],
    ),
    (
        "wrong_version",
        "version: v2\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["1:10: unsupported version 'v2'; expected v1 (version)"],
    ),
    (
        "int_version",
        "version: 1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["1:10: unsupported version 1; expected v1 (version)"],
    ),
    (
        "missing_configs",
        "version: v1\n",
        ["1:1: missing key 'vgpu-configs'; define at least one named layout (vgpu-configs)"],
    ),
    (
        "empty_configs",
        "version: v1\nvgpu-configs: {}\n",
        ["2:15: vgpu-configs is empty; define at least one named layout (vgpu-configs)"],
    ),
    (
        "configs_list",
        "version: v1\nvgpu-configs: [a]\n",
        ["2:15: vgpu-configs must map config names to layouts, found a list (vgpu-configs)"],
    ),
    (
        "dup_top_key",
        "version: v1\nversion: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["2:1: duplicate key 'version' (first defined on line 1) (version)"],
    ),
    (
        "dup_config",
        H
        + "  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["6:3: duplicate key 'c' (first defined on line 3) (vgpu-configs.c)"],
    ),
    (
        "dup_type",
        one("devices: all\nvgpu-devices:\n  A10-4Q: 1\n  A10-4Q: 2"),
        [
            "7:9: duplicate key 'A10-4Q' (first defined on line 6) (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "dup_type_prefixed",
        one("devices: all\nvgpu-devices:\n  A10-4Q: 1\n  NVIDIA A10-4Q: 2"),
        [
            "7:9: type A10-4Q is listed twice (also as 'A10-4Q' on line 6) (vgpu-configs.c[0].vgpu-devices.NVIDIA A10-4Q)"
        ],
    ),
    (
        "unknown_top_key",
        "version: v1\nvgpu-config: {}\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "2:1: unknown key 'vgpu-config' in the top level; did you mean vgpu-configs? (vgpu-config)"
        ],
    ),
    (
        "unknown_top_key_far",
        "version: v1\nzzz: 1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "2:1: unknown key 'zzz' in the top level; expected one of: version, vgpu-configs, node-selectors, default, policy (zzz)"
        ],
    ),
    (
        "unknown_entry_key",
        one("devices: all\ndevice-filters: '0x223610DE'\nvgpu-devices: {A10-4Q: 1}"),
        [
            "5:7: unknown key 'device-filters' in an entry; did you mean device-filter? (vgpu-configs.c[0].device-filters)"
        ],
    ),
    (
        "unknown_config_key",
        H + "  c:\n    policy: {prune: true}\n    entrys: []\n",
        [
            "4:5: config 'c' has no 'entries' list (vgpu-configs.c)",
            "5:5: unknown key 'entrys' in config 'c'; did you mean entries? (vgpu-configs.c.entrys)",
        ],
    ),
    (
        "config_scalar",
        H + "  c: 5\n",
        [
            "3:6: config 'c' must be a list of entries (or a mapping with entries and policy), found 5 (vgpu-configs.c)"
        ],
    ),
    (
        "config_empty_list",
        H + "  c: []\n",
        ["3:6: config 'c' has no entries (vgpu-configs.c)"],
    ),
    (
        "entry_scalar",
        H + "  c:\n    - all\n",
        [
            "4:7: an entry must be a mapping with devices and vgpu-devices, found 'all' (vgpu-configs.c[0])"
        ],
    ),
    (
        "missing_devices",
        one("vgpu-devices: {A10-4Q: 1}"),
        ["4:7: missing key 'devices' in this entry (vgpu-configs.c[0])"],
    ),
    (
        "missing_vgpu_devices",
        one("devices: all"),
        ["4:7: missing key 'vgpu-devices' in this entry (vgpu-configs.c[0])"],
    ),
    (
        "count_zero",
        one("devices: all\nvgpu-devices: {A10-4Q: 0}"),
        [
            "5:30: the count of A10-4Q must be a whole number of 1 or more, found 0 (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "count_negative",
        one("devices: all\nvgpu-devices: {A10-4Q: -2}"),
        [
            "5:30: the count of A10-4Q must be a whole number of 1 or more, found -2 (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "count_float",
        one("devices: all\nvgpu-devices: {A10-4Q: 1.5}"),
        [
            "5:30: the count of A10-4Q must be a whole number of 1 or more, found 1.5 (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "count_string",
        one("devices: all\nvgpu-devices: {A10-4Q: two}"),
        [
            "5:30: the count of A10-4Q must be a whole number of 1 or more, found 'two' (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "count_bool",
        one("devices: all\nvgpu-devices: {A10-4Q: true}"),
        [
            "5:30: the count of A10-4Q must be a whole number of 1 or more, found true (a boolean) (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "count_null",
        one("devices: all\nvgpu-devices: {A10-4Q: }"),
        [
            "5:30: the count of A10-4Q must be a whole number of 1 or more, found nothing (null) (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "vgpu_devices_list",
        one("devices: all\nvgpu-devices: [A10-4Q]"),
        [
            "5:21: vgpu-devices must map vGPU type names to counts (use {} for no vGPUs), found a list (vgpu-configs.c[0].vgpu-devices)"
        ],
    ),
    (
        "type_case",
        one("devices: all\nvgpu-devices: {a10-4q: 1}"),
        [
            "5:22: unknown vGPU type 'a10-4q'; did you mean A10-4Q? (vgpu-configs.c[0].vgpu-devices.a10-4q)"
        ],
    ),
    (
        "type_lookalike",
        one("devices: all\nvgpu-devices: {A1O-4Q: 1}"),
        [
            "5:22: unknown vGPU type 'A1O-4Q'; did you mean A10-4Q? (vgpu-configs.c[0].vgpu-devices.A1O-4Q)"
        ],
    ),
    (
        "type_stray_spaces",
        one('devices: all\nvgpu-devices: {" A100-5C": 1}'),
        [
            "5:22: vGPU type ' A100-5C' has stray spaces; did you mean A100-5C? (vgpu-configs.c[0].vgpu-devices. A100-5C)"
        ],
    ),
    (
        "type_malformed_product",
        one('devices: all\nvgpu-devices: {"A100- 1-5C": 1}'),
        [
            "5:22: vGPU type 'A100- 1-5C' has a malformed product part (a space inside the name); did you mean A100-1-5C? (vgpu-configs.c[0].vgpu-devices.A100- 1-5C)"
        ],
    ),
    (
        "type_digits_for_product",
        one("devices: all\nvgpu-devices: {1-5C: 1}"),
        [
            "5:22: vGPU type '1-5C' has a malformed product part '1' (vgpu-configs.c[0].vgpu-devices.1-5C)"
        ],
    ),
    (
        "type_of_a_family_the_filter_does_not_select",
        one('devices: all\ndevice-filter: "0x1EB810DE"\nvgpu-devices: {A2-3Q: 1}'),
        [
            "5:22: device-filter '0x1EB810DE' selects T4, but A2-3Q is a type of A2 (vgpu-configs.c[0].device-filter)"
        ],
    ),
    (
        "types_of_two_families",
        one("devices: all\nvgpu-devices: {A2-3Q: 1, T4-1B: 1}"),
        [
            "5:21: types of different GPU models in one entry: A2-3Q (A2), T4-1B (T4); an entry lays out one kind of GPU (vgpu-configs.c[0].vgpu-devices)"
        ],
    ),
    (
        "uncatalogued_type_of_another_size",
        one("devices: all\nvgpu-devices: {A2-4Q: 1, A2-3Q: 1}"),
        [
            "5:32: A2-4Q (4096 MiB) and A2-3Q (3072 MiB) in one entry: vGPUs on one GPU share one framebuffer size (series of the same size may mix) unless the GPU is in mixed-size mode; the A2 has no mixed-size mode (the driver has it for Ada, Hopper and Blackwell GPUs, by inference) (vgpu-configs.c[0].vgpu-devices.A2-3Q)"
        ],
    ),
    (
        "type_garbage",
        one("devices: all\nvgpu-devices: {xyz: 1}"),
        [
            "5:22: unknown vGPU type 'xyz': not a vGPU type name (such as A10-4Q or A100-1-5C) (vgpu-configs.c[0].vgpu-devices.xyz)"
        ],
    ),
    (
        "type_underscore",
        one("devices: all\nvgpu-devices: {A10_4Q: 1}"),
        [
            "5:22: unknown vGPU type 'A10_4Q'; did you mean A10-4Q? (vgpu-configs.c[0].vgpu-devices.A10_4Q)"
        ],
    ),
    (
        "count_over_max",
        one("devices: all\nvgpu-devices: {A10-4Q: 7}"),
        [
            "5:30: A10-4Q: 7 exceeds 6, the most one A10 holds (vgpu-configs.c[0].vgpu-devices.A10-4Q)"
        ],
    ),
    (
        "sum_over_max",
        one("devices: all\nvgpu-devices: {L40S-4Q: 8, L40S-4C: 5}"),
        [
            "5:22: 13 vGPUs of 4096 MiB exceed 12, the most one L40S holds (vgpu-configs.c[0].vgpu-devices)"
        ],
    ),
    (
        "mixed_sizes",
        one("devices: all\nvgpu-devices: {A10-4Q: 2, A10-8Q: 1}"),
        [
            "5:33: A10-4Q (4096 MiB) and A10-8Q (8192 MiB) in one entry: vGPUs on one GPU share one framebuffer size (series of the same size may mix) unless the GPU is in mixed-size mode; the A10 has no mixed-size mode (the driver has it for Ada, Hopper and Blackwell GPUs, by inference) (vgpu-configs.c[0].vgpu-devices.A10-8Q)"
        ],
    ),
    (
        "mixed_mig",
        one("devices: all\nvgpu-devices: {A100-4C: 1, A100-1-5C: 1}"),
        [
            "5:22: A100-4C is time-sliced and A100-1-5C is MIG-backed; one GPU runs either kind, not both (vgpu-configs.c[0].vgpu-devices.A100-4C)"
        ],
    ),
    (
        "mig_slices",
        one("devices: all\nvgpu-devices: {A100-3-20C: 2, A100-1-5C: 2}"),
        [
            "5:21: the MIG-backed types need GPU instances 1g.5gb: 2, 3g.20gb: 2 on one A100: the GPU instances (1g.5gb: 2, 3g.20gb: 2) take 8 compute slices; one A100 PCIe 40GB has 7 (vgpu-configs.c[0].vgpu-devices)"
        ],
    ),
    (
        "mig_memory",
        one("devices: all\nvgpu-devices: {A100-3-20C: 2, A100-1-5C: 1}"),
        [
            "5:21: the MIG-backed types need GPU instances 1g.5gb: 1, 3g.20gb: 2 on one A100: the GPU instances (1g.5gb: 1, 3g.20gb: 2) take 9 memory slices of 5120 MiB; one A100 PCIe 40GB has 8 (vgpu-configs.c[0].vgpu-devices)"
        ],
    ),
    (
        "sizes_without_mixed_size_mode",
        one("devices: all\nvgpu-devices: {L40S-24Q: 1, L40S-12Q: 2}"),
        [
            "5:22: L40S-12Q (12288 MiB) and L40S-24Q (24576 MiB) in one entry: vGPUs on one GPU share one framebuffer size (series of the same size may mix) unless the GPU is in mixed-size mode; add mode: mixed-size to this entry (vgpu-configs.c[0].vgpu-devices.L40S-24Q)"
        ],
    ),
    (
        "mixed_size_on_a_model_without_it",
        one("devices: all\nmode: mixed-size\nvgpu-devices: {A10-4Q: 2, A10-8Q: 1}"),
        [
            "5:13: mode: mixed-size: the A10 has no mixed-size mode (the driver has it for Ada, Hopper and Blackwell GPUs, by inference) (vgpu-configs.c[0].mode)"
        ],
    ),
    (
        "mixed_size_infeasible",
        one("devices: all\nmode: mixed-size\nvgpu-devices: {L40S-24Q: 1, L40S-16Q: 2}"),
        [
            "6:21: mode: mixed-size: L40S-24Q × 1 (24576 MiB, 24 slots each), L40S-16Q × 2 (16384 MiB, 16 slots each) need 56 slots of 1024 MiB; one L40S has 48 (49152 MiB) (vgpu-configs.c[0].vgpu-devices)"
        ],
    ),
    (
        "mode_unknown",
        one("devices: all\nmode: mixed\nvgpu-devices: {L40S-24Q: 1}"),
        [
            "5:13: mode must be one of time-sliced, mixed-size, mig, found 'mixed'; did you mean mixed-size? (vgpu-configs.c[0].mode)"
        ],
    ),
    (
        "mode_mig_with_time_sliced_types",
        one("devices: all\nmode: mig\nvgpu-devices: {A10-4Q: 2}"),
        [
            "5:13: mode: mig lays out MIG-backed types, and A10-4Q is time-sliced; leave mode out or write time-sliced (vgpu-configs.c[0].mode)"
        ],
    ),
    (
        "mode_time_sliced_with_mig_backed_types",
        one("devices: all\nmode: mixed-size\nvgpu-devices: {A100-1-5C: 2}"),
        [
            "5:13: mode: mixed-size lays out time-sliced types, and A100-1-5C is MIG-backed; leave mode out or write mig (vgpu-configs.c[0].mode)"
        ],
    ),
    (
        "mig_geometry_without_mig",
        one("devices: all\nmig-geometry: {1g.24gb: 1}\nvgpu-devices: {A10-4Q: 2}"),
        [
            "5:21: mig-geometry sets GPU instances for MIG-backed types (mode: mig); this entry's mode is time-sliced (vgpu-configs.c[0].mig-geometry)"
        ],
    ),
    (
        "mig_geometry_unknown_profile",
        one("devices: all\nmig-geometry: {1g.6gb: 2}\nvgpu-devices: {A100-1-5C: 2}"),
        [
            "5:22: the A100 has no GPU instance profile 1g.6gb (1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb); did you mean 1g.5gb? (vgpu-configs.c[0].mig-geometry.1g.6gb)"
        ],
    ),
    (
        "mig_geometry_does_not_fit",
        one(
            "devices: all\nmig-geometry: {4g.20gb: 1, 3g.20gb: 1, 1g.5gb: 1}\n"
            "vgpu-devices: {A100-1-5C: 1}"
        ),
        [
            "5:21: mig-geometry: the GPU instances (1g.5gb: 1, 3g.20gb: 1, 4g.20gb: 1) take 8 compute slices; one A100 PCIe 40GB has 7 (vgpu-configs.c[0].mig-geometry)"
        ],
    ),
    (
        "mig_geometry_too_small_for_the_types",
        one("devices: all\nmig-geometry: {1g.5gb: 2}\nvgpu-devices: {A100-1-5C: 3}"),
        [
            "5:21: mig-geometry: the types need 3 GPU instances 1g.5gb (A100-1-5C: 3 (1 per GPU instance) need 3; one framebuffer size per GPU instance); mig-geometry has 2 (vgpu-configs.c[0].mig-geometry)"
        ],
    ),
    (
        "mig_geometry_not_a_profile",
        one("devices: all\nmig-geometry: {big: 1, 1g.5gb: 0}\nvgpu-devices: {A100-1-5C: 1}"),
        [
            "5:22: 'big' is not a GPU instance profile; write it as nvidia-smi does, e.g. 1g.24gb or 1g.5gb+me (vgpu-configs.c[0].mig-geometry.big)",
            "5:38: the count of 1g.5gb must be a whole number from 1 to 64, found 0 (vgpu-configs.c[0].mig-geometry.1g.5gb)",
        ],
    ),
    (
        "mig_geometry_not_a_mapping",
        one("devices: all\nmig-geometry: 1g.5gb\nvgpu-devices: {A100-1-5C: 1}"),
        [
            "5:21: mig-geometry must map GPU instance profiles to counts, e.g. {1g.24gb: 4}, found '1g.5gb' (vgpu-configs.c[0].mig-geometry)"
        ],
    ),
    (
        "two_models",
        one("devices: all\nvgpu-devices: {A10-4Q: 1, A40-4Q: 1}"),
        [
            "5:21: types of different GPU models in one entry: A10-4Q (A10), A40-4Q (A40); an entry lays out one kind of GPU (vgpu-configs.c[0].vgpu-devices)"
        ],
    ),
    (
        "filter_model_mismatch",
        one("devices: all\ndevice-filter: '0x223610DE'\nvgpu-devices: {A40-4Q: 1}"),
        [
            "5:22: device-filter '0x223610DE' selects A10, but A40-4Q is a type of A40 (vgpu-configs.c[0].device-filter)"
        ],
    ),
    (
        "filter_subsystem_mismatch",
        one("devices: all\ndevice-filter: '0x25B610DE:0x157E10DE'\nvgpu-devices: {A16-4Q: 1}"),
        [
            "5:22: device-filter '0x25B610DE:0x157E10DE' selects A2, but A16-4Q is a type of A16 (vgpu-configs.c[0].device-filter)"
        ],
    ),
    (
        "filter_bad",
        one("devices: all\ndevice-filter: '0x2236'\nvgpu-devices: {A10-4Q: 1}"),
        [
            "5:22: bad device-filter '0x2236': expected 0xDDDDVVVV or 0xDDDDVVVV:0xSSSSVVVV (PCI device and vendor id in hex), e.g. 0x223610DE (vgpu-configs.c[0].device-filter)"
        ],
    ),
    (
        "filter_vendor",
        one("devices: all\ndevice-filter: '0x22361002'\nvgpu-devices: {A10-4Q: 1}"),
        [
            "5:22: bad device-filter '0x22361002': vendor id 0x1002 is not NVIDIA's (0x10DE); did you mean 0x223610DE? (vgpu-configs.c[0].device-filter)"
        ],
    ),
    (
        "filter_list_bad_item",
        one("devices: all\ndevice-filter: ['0x223610DE', 'nope']\nvgpu-devices: {A10-4Q: 1}"),
        [
            "5:37: bad device-filter 'nope': expected 0xDDDDVVVV or 0xDDDDVVVV:0xSSSSVVVV (PCI device and vendor id in hex), e.g. 0x223610DE (vgpu-configs.c[0].device-filter[1])"
        ],
    ),
    (
        "filter_bad_subsystem",
        one("devices: all\ndevice-filter: '0x25B610DE:0x157E'\nvgpu-devices: {A2-4Q: 1}"),
        [
            "5:22: bad device-filter '0x25B610DE:0x157E': expected 0xDDDDVVVV or 0xDDDDVVVV:0xSSSSVVVV (PCI device and vendor id in hex), e.g. 0x223610DE (vgpu-configs.c[0].device-filter)"
        ],
    ),
    (
        "devices_word",
        one("devices: some\nvgpu-devices: {A10-4Q: 1}"),
        [
            "4:16: devices must be 'all' or a list of GPU indices and PCI addresses, found 'some' (vgpu-configs.c[0].devices)"
        ],
    ),
    (
        "devices_int",
        one("devices: 0\nvgpu-devices: {A10-4Q: 1}"),
        [
            "4:16: devices must be 'all' or a list of GPU indices and PCI addresses, found 0 (vgpu-configs.c[0].devices)"
        ],
    ),
    (
        "devices_empty",
        one("devices: []\nvgpu-devices: {A10-4Q: 1}"),
        ["4:16: devices is an empty list; it selects no GPU (vgpu-configs.c[0].devices)"],
    ),
    (
        "devices_negative",
        one("devices: [-1]\nvgpu-devices: {A10-4Q: 1}"),
        ["4:17: a GPU index must be 0 or more, found -1 (vgpu-configs.c[0].devices[0])"],
    ),
    (
        "devices_bool",
        one("devices: [true]\nvgpu-devices: {A10-4Q: 1}"),
        [
            "4:17: a device must be a GPU index or a PCI address, found true (a boolean) (vgpu-configs.c[0].devices[0])"
        ],
    ),
    (
        "devices_bad_pci",
        one("devices: ['3b:00']\nvgpu-devices: {A10-4Q: 1}"),
        [
            "4:17: '3b:00' is not a PCI address; expected dddd:bb:dd.f such as 0000:3b:00.0 (or the short form 3b:00.0) (vgpu-configs.c[0].devices[0])"
        ],
    ),
    (
        "devices_dup",
        one("devices: [0, 1, 0]\nvgpu-devices: {A10-4Q: 1}"),
        ["4:23: GPU 0 is listed twice (first on line 4) (vgpu-configs.c[0].devices[2])"],
    ),
    (
        "devices_dup_pci",
        one("devices: ['3b:00.0', '0000:3B:00.0']\nvgpu-devices: {A10-4Q: 1}"),
        ["4:28: GPU 0000:3b:00.0 is listed twice (first on line 4) (vgpu-configs.c[0].devices[1])"],
    ),
    (
        "default_unknown",
        "version: v1\ndefault: a1O\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["2:10: unknown config 'a1O'; did you mean a10? (default)"],
    ),
    (
        "default_unknown_far",
        "version: v1\ndefault: zzz\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["2:10: unknown config 'zzz'; defined: a10 (default)"],
    ),
    (
        "selector_unknown_config",
        "version: v1\nnode-selectors:\n  - match-labels: {pool: a}\n    config: a11\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:13: unknown config 'a11'; did you mean a10? (node-selectors[0].config)"],
    ),
    (
        "selector_missing_config",
        "version: v1\nnode-selectors:\n  - match-labels: {pool: a}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["3:5: missing key 'config' in this node-selector (node-selectors[0])"],
    ),
    (
        "selector_bad_operator",
        "version: v1\nnode-selectors:\n  - match-expressions:\n      - {key: pool, operator: in, values: [a]}\n    config: a10\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "4:31: operator must be one of In, NotIn, Exists, DoesNotExist, found 'in'; did you mean In? (node-selectors[0].match-expressions[0].operator)"
        ],
    ),
    (
        "selector_in_no_values",
        "version: v1\nnode-selectors:\n  - match-expressions:\n      - {key: pool, operator: In}\n    config: a10\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "4:9: operator In needs a non-empty list of values (node-selectors[0].match-expressions[0])"
        ],
    ),
    (
        "selector_exists_values",
        "version: v1\nnode-selectors:\n  - match-expressions:\n      - {key: pool, operator: Exists, values: [a]}\n    config: a10\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "4:47: operator Exists takes no values; remove them (node-selectors[0].match-expressions[0].values)"
        ],
    ),
    (
        "selector_label_bool",
        "version: v1\nnode-selectors:\n  - match-labels: {gpu: true}\n    config: a10\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "3:25: a label value must be a string, found true (a boolean); quote it: 'true' (node-selectors[0].match-labels.gpu)"
        ],
    ),
    (
        "selector_unknown_key",
        "version: v1\nnode-selectors:\n  - matchLabels: {gpu: a}\n    config: a10\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "3:5: unknown key 'matchLabels' in a node-selector; did you mean match-labels? (node-selectors[0].matchLabels)"
        ],
    ),
    (
        "selectors_mapping",
        "version: v1\nnode-selectors: {a: b}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["2:17: node-selectors must be a list, found a mapping (node-selectors)"],
    ),
    (
        "policy_in_use",
        "version: v1\npolicy: {in-use: protekt}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "2:18: in-use must be one of protect, ignore, evacuate, found 'protekt'; did you mean protect? (policy.in-use)"
        ],
    ),
    (
        "policy_prune_str",
        "version: v1\npolicy: {prune: 'yes'}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["2:17: prune must be true or false, found 'yes' (policy.prune)"],
    ),
    (
        "policy_unknown_key",
        "version: v1\npolicy: {prunes: true}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["2:10: unknown key 'prunes' in policy; did you mean prune? (policy.prunes)"],
    ),
    (
        "policy_sriov_bool",
        "version: v1\nvgpu-configs:\n  a10:\n    policy: {sriov: false}\n    entries:\n      - devices: all\n        vgpu-devices: {A10-4Q: 1}\n",
        [
            "4:21: sriov must be one of auto, off, found false (a boolean); did you mean off? (vgpu-configs.a10.policy.sriov)"
        ],
    ),
    (
        "evacuation_in_flight_over",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {max-in-flight: 1001}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:31: max-in-flight must be a whole number from 0 to 1000, found 1001 (policy.evacuation.max-in-flight)"],
    ),
    (
        "evacuation_in_flight_negative",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {max-in-flight: -1}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:31: max-in-flight must be a whole number from 0 to 1000, found -1 (policy.evacuation.max-in-flight)"],
    ),
    (
        "evacuation_per_node_zero",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {max-per-node: 0}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:30: max-per-node must be a whole number from 1 to 1000, found 0 (policy.evacuation.max-per-node)"],
    ),
    (
        "evacuation_per_node_text",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {max-per-node: two}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:30: max-per-node must be a whole number from 1 to 1000, found 'two' (policy.evacuation.max-per-node)"],
    ),
    (
        "evacuation_timeout_short",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {timeout: 9s}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:25: timeout must be from 10s to 24h, found '9s' (policy.evacuation.timeout)"],
    ),
    (
        "evacuation_timeout_long",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {timeout: 1441m}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:25: timeout must be from 10s to 24h, found '1441m' (policy.evacuation.timeout)"],
    ),
    (
        "evacuation_timeout_number",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {timeout: 600}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:25: timeout must be a duration such as 90s, 10m or 1h (a whole number with s, m or h), found 600; did you mean 600s? (policy.evacuation.timeout)"],
    ),
    (
        "evacuation_timeout_unit",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {timeout: 10min}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:25: timeout must be a duration such as 90s, 10m or 1h (a whole number with s, m or h), found '10min' (policy.evacuation.timeout)"],
    ),
    (
        "evacuation_restart_text",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {restart: 'yes'}\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:25: restart must be true or false, found 'yes' (policy.evacuation.restart)"],
    ),
    (
        "evacuation_not_mapping",
        "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: true\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["4:15: evacuation must be a mapping with max-in-flight, max-per-node, timeout or restart, found true (a boolean) (policy.evacuation)"],
    ),
    (
        "evacuation_in_flight_per_config",
        "version: v1\npolicy: {in-use: evacuate}\nvgpu-configs:\n  a10:\n    policy:\n      evacuation: {max-in-flight: 2, timeout: 5m}\n    entries:\n      - devices: all\n        vgpu-devices: {A10-4Q: 1}\n",
        [
            "6:35: max-in-flight (found 2) counts VMs moving at once across the whole fleet, so only the top-level policy sets it; move it to policy.evacuation at the top of the file (vgpu-configs.a10.policy.evacuation.max-in-flight)"
        ],
    ),
    (
        "config_name_label",
        H + "  'a b':\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        [
            "3:3: config name 'a b' cannot be a node label value: use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (vgpu-configs.a b)"
        ],
    ),
    (
        "merge_key",
        "version: v1\n<<: {a: 1}\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n",
        ["2:1: merge keys (<<) are not supported; write the keys out"],
    ),
    (
        "reused_anchor",
        H
        + "  a: &x\n    - devices: all\n      vgpu-devices: {A10-4Q: 1}\n  b: &x\n    - devices: all\n      vgpu-devices: {A10-4Q: 2}\n",
        ["6:6: anchor &x is already defined on line 3, column 6; give each anchor its own name"],
    ),
    (
        "reused_anchor_inside_its_own_node",
        "version: v1\nvgpu-configs: &c {a: &c [1]}\n",
        ["2:22: anchor &c is already defined on line 2, column 15; give each anchor its own name"],
    ),
    (
        "two_documents",
        "version: v1\n---\nversion: v1\n",
        [
            "2:1: not valid YAML: expected a single document in the stream, but found another document"
        ],
    ),
    (
        "many_errors",
        H
        + "  c:\n    - devices: [x]\n      vgpu-devices: {A10-4Q: 0, B: 1}\n  d:\n    - devices: all\n      device-filter: 12\n      vgpu-devices: {}\n",
        [
            "4:17: 'x' is not a PCI address; expected dddd:bb:dd.f such as 0000:3b:00.0 (or the short form 3b:00.0) (vgpu-configs.c[0].devices[0])",
            "5:30: the count of A10-4Q must be a whole number of 1 or more, found 0 (vgpu-configs.c[0].vgpu-devices.A10-4Q)",
            "5:33: unknown vGPU type 'B': not a vGPU type name (such as A10-4Q or A100-1-5C) (vgpu-configs.c[0].vgpu-devices.B)",
            "8:22: bad device-filter '12': expected 0xDDDDVVVV or 0xDDDDVVVV:0xSSSSVVVV (PCI device and vendor id in hex), e.g. 0x223610DE (vgpu-configs.d[0].device-filter)",
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_document(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text, "f.yaml", catalog=CATALOG)
    assert [str(issue) for issue in caught.value.issues] == [f"f.yaml:{m}" for m in expected]


def test_error_has_no_traceback_text() -> None:
    with pytest.raises(ConfigError) as caught:
        load_text("version: v1\nvgpu-configs: [\n", "f.yaml", catalog=CATALOG)
    assert "Traceback" not in str(caught.value)
    assert str(caught.value).startswith("f.yaml:3:1: not valid YAML")


def test_a_config_with_errors_still_counts_as_defined() -> None:
    text = "version: v1\ndefault: a\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices: {A10-4W: 1}\n"
    with pytest.raises(ConfigError) as err:
        load_text(text, "f.yaml", catalog=CATALOG)
    assert [str(i) for i in err.value.issues] == [
        "f.yaml:6:22: unknown vGPU type 'A10-4W'; did you mean A10-4Q or A10-4C? "
        "(vgpu-configs.a[0].vgpu-devices.A10-4W)"
    ]
