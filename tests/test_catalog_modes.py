"""The catalog's MIG GPU instance profiles and mixed-size placement (both inferred:
nvidia-sysfs.md §5.3–5.4), checked against every MIG-backed row of the catalog."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vgpu_state.catalog import GpuModel, VgpuType, default_catalog
from vgpu_state.catalog.mig import (
    GiProfile,
    geometry_fits,
    geometry_for,
    geometry_holds,
    gi_profile_for,
    mig_capable,
    mig_profiles,
    mixed_size_capable,
)
from vgpu_state.catalog.placement import PlacedVgpu, Placement, grid, place

CATALOG = default_catalog()
PRO6000 = "RTX PRO 6000 Blackwell Server Edition"
PRO4500 = "RTX PRO 4500 Blackwell Server Edition (inferred)"
MODELS_CSV = Path(__file__).resolve().parent.parent / "vgpu_state/catalog/data/models.csv"


def model(name: str) -> GpuModel:
    found = CATALOG.model(name) or CATALOG.find_model(name)
    assert found is not None, name
    return found


MIG_ROWS = [(m, t) for m in CATALOG.models for t in m.types if t.is_mig]


def test_the_catalog_has_mig_backed_rows_of_every_mig_model() -> None:
    assert len(MIG_ROWS) == 209
    assert sum(mig_capable(m) for m in CATALOG.models) == 28


@pytest.mark.parametrize(("m", "t"), MIG_ROWS, ids=[f"{m.name}:{t.name}" for m, t in MIG_ROWS])
def test_every_mig_backed_type_has_a_profile_and_its_limit_is_per_gi_times_gis(
    m: GpuModel, t: VgpuType
) -> None:
    name = t.name
    found = gi_profile_for(m, name)
    assert found is not None
    profile, per_gi = found
    assert profile in mig_profiles(m)
    assert profile.slices == t.mig_slices
    assert per_gi * profile.max_per_gpu == t.max_instances
    assert profile.memory_mib >= t.framebuffer_mib * per_gi
    # As many GIs of its profile as the catalog's count needs fit one GPU, one more does not.
    assert geometry_fits(m, [(profile.name, profile.max_per_gpu)]) is None
    assert geometry_fits(m, [(profile.name, profile.max_per_gpu + 1)]) is not None
    assert geometry_for(m, {name: t.max_instances}) == ((profile.name, profile.max_per_gpu),)


@pytest.mark.parametrize(
    ("model_name", "type_name", "profile", "per_gi", "gis"),
    [
        (PRO6000, "DC-1-24Q", "1g.24gb", 1, 4),
        (PRO6000, "DC-1-12Q", "1g.24gb", 2, 4),
        (PRO6000, "DC-1-2Q", "1g.24gb", 12, 4),
        (PRO6000, "DC-2-12Q", "2g.48gb", 4, 2),
        (PRO6000, "DC-4-24C", "4g.96gb", 4, 1),
        ("A100 PCIe 40GB", "A100-1-5C", "1g.5gb", 1, 7),
        ("A100 PCIe 40GB", "A100-1-5CME", "1g.5gb+me", 1, 1),
        ("A100 PCIe 40GB", "A100-1-10C", "1g.10gb", 1, 4),
        ("A100 PCIe 40GB", "A100-3-20C", "3g.20gb", 1, 2),
        ("A100 PCIe 40GB", "A100-7-40C", "7g.40gb", 1, 1),
        ("A30", "A30-1-6C", "1g.6gb", 1, 4),
        ("A30", "A30-1-6CME", "1g.6gb+me", 1, 1),
        ("A30", "A30-2-12C", "2g.12gb", 1, 2),
        ("A30", "A30-2-12CME", "2g.12gb+me", 1, 1),
        ("A30", "A30-4-24C", "4g.24gb", 1, 1),
        ("H100 NVL (H100L 94GB)", "H100L-3-47C", "3g.47gb", 1, 2),
        (PRO4500, "DC-1-16Q", "1g.16gb", 1, 2),
        (PRO4500, "DC-2-8C", "2g.32gb", 4, 1),
        (PRO4500, "DC-2-32Q", "2g.32gb", 1, 1),
    ],
)
def test_gi_profiles_of_named_types(
    model_name: str, type_name: str, profile: str, per_gi: int, gis: int
) -> None:
    found = gi_profile_for(model(model_name), type_name)
    assert found is not None
    assert (found[0].name, found[1], found[0].max_per_gpu) == (profile, per_gi, gis)


def test_profiles_of_a_model_and_of_a_time_sliced_type() -> None:
    a100 = model("A100 PCIe 40GB")
    assert [p.name for p in mig_profiles(a100)] == [
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    ]  # fmt: skip
    assert mig_profiles(model(PRO6000)) == (
        GiProfile("1g.24gb", 1, 24576, 4),
        GiProfile("2g.48gb", 2, 49152, 2),
        GiProfile("4g.96gb", 4, 98304, 1),
    )
    assert gi_profile_for(a100, "A100-4C") is None
    assert gi_profile_for(a100, "DC-1-24Q") is None
    assert mig_profiles(model("A10")) == () and not mig_capable(model("A10"))


def test_nominal_gi_names_that_add_up_past_the_framebuffer_still_fit() -> None:
    # 4 × 1g.24gb is "96 GiB" by name on a 94 GB card: memory counts in slices.
    h100l = model("H100 NVL (H100L 94GB)")
    assert h100l.framebuffer_mib < 4 * 24576
    assert geometry_fits(h100l, [("1g.24gb", 4)]) is None
    assert geometry_fits(model("B300 (HGX)"), [("3g.135gb", 2)]) is None


def test_a_geometry_fits_by_slices_memory_and_per_profile_counts() -> None:
    a100 = model("A100 PCIe 40GB")
    assert geometry_fits(a100, [("4g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 1)]) is None
    assert geometry_fits(a100, [("3g.20gb", 2), ("1g.5gb", 1)]) == (
        "the GPU instances (3g.20gb: 2, 1g.5gb: 1) take 9 memory slices of 5120 MiB; "
        "one A100 PCIe 40GB has 8"
    )
    assert geometry_fits(a100, [("4g.20gb", 1), ("3g.20gb", 1), ("1g.5gb", 1)]) == (
        "the GPU instances (4g.20gb: 1, 3g.20gb: 1, 1g.5gb: 1) take 8 compute slices; "
        "one A100 PCIe 40GB has 7"
    )
    assert geometry_fits(a100, [("1g.5gb+me", 2)]) == (
        "2 × 1g.5gb+me exceed 1, the most one A100 PCIe 40GB holds"
    )
    assert geometry_fits(model(PRO6000), [("1g.24gb", 2), ("2g.48gb", 1)]) is None
    assert geometry_fits(model(PRO6000), [("1g.24gb", 1), ("4g.96gb", 1)]) is not None


def test_an_unknown_profile_is_named_with_the_closest_one() -> None:
    assert geometry_fits(model(PRO6000), [("1g.23gb", 1)]) == (
        f"the {PRO6000} has no GPU instance profile '1g.23gb' "
        "(1g.24gb, 2g.48gb, 4g.96gb); did you mean 1g.24gb?"
    )
    assert geometry_fits(model("A10"), [("1g.24gb", 1)]) == (
        "the A10 has no MIG-backed vGPU types (no GPU instances)"
    )


def test_geometry_for_takes_the_fewest_gis_one_framebuffer_size_each() -> None:
    pro = model(PRO6000)
    assert geometry_for(pro, {"DC-1-24Q": 4}) == (("1g.24gb", 4),)
    # Q and C of one size share GIs; another size takes GIs of its own.
    assert geometry_for(pro, {"DC-1-12Q": 3, "DC-1-12C": 1}) == (("1g.24gb", 2),)
    assert geometry_for(pro, {"DC-1-12Q": 1, "DC-1-6Q": 1}) == (("1g.24gb", 2),)
    assert geometry_for(pro, {"DC-1-24Q": 2, "DC-2-24Q": 2}) == (("1g.24gb", 2), ("2g.48gb", 1))
    assert geometry_for(pro, {"DC-16Q": 2}) == ()
    assert geometry_for(model("A100 PCIe 40GB"), {"A100-1-5C": 3, "A100-1-5CME": 1}) == (
        ("1g.5gb", 3),
        ("1g.5gb+me", 1),
    )


def test_a_geometry_that_cannot_hold_the_types_says_how_many_gis_they_need() -> None:
    pro = model(PRO6000)
    assert geometry_holds(pro, [("1g.24gb", 4)], {"DC-1-12Q": 8}) is None
    assert geometry_holds(pro, [("1g.24gb", 2), ("2g.48gb", 1)], {"DC-1-12Q": 4}) is None
    assert geometry_holds(pro, [("1g.24gb", 1)], {"DC-1-12Q": 1, "DC-1-6Q": 1}) == (
        "the types need 2 GPU instances 1g.24gb (DC-1-12Q: 1 (2 per GPU instance) need 1; "
        "DC-1-6Q: 1 (4 per GPU instance) need 1; one framebuffer size per GPU instance); "
        "mig-geometry has 1"
    )
    assert geometry_holds(pro, [("1g.24gb", 4)], {"DC-2-48Q": 1}) == (
        "the types need 1 GPU instance 2g.48gb (DC-2-48Q: 1 (1 per GPU instance) need 1; one "
        "framebuffer size per GPU instance); mig-geometry has 0"
    )


MIXED_SIZE = {
    "L2", "L4", "L20", "L40", "L40S", "RTX 5000 Ada Generation", "RTX 5880 Ada Generation",
    "RTX 6000 Ada Generation", "H100 PCIe 80GB", "H100 SXM5 80GB", "H100 SXM5 64GB",
    "H100 SXM5 94GB", "H100 NVL (H100L 94GB)", "H800 PCIe 80GB", "H800 SXM5 80GB",
    "H800L 94GB", "H200 NVL 141GB", "H200 SXM 141GB", "H20 96GB", "H20 HBM3e 141GB",
    "GH200 96GB", "GH200 144GB HBM3e", "B200 (HGX)", "GB200", "B300 (HGX)", PRO6000, PRO4500,
    "RTX PRO 6000D Blackwell (6000D-*)",
}  # fmt: skip


def test_mixed_size_mode_is_inferred_for_the_ada_hopper_and_blackwell_models() -> None:
    assert {m.name for m in CATALOG.models if mixed_size_capable(m)} == MIXED_SIZE
    assert {m.mixed_size for m in CATALOG.models if m.name in MIXED_SIZE} == {"inferred"}
    for old in ("A10", "A2", "Tesla T4", "A100 PCIe 40GB", "A40"):
        assert not mixed_size_capable(model(old))


def test_every_models_csv_row_names_a_model_of_the_table() -> None:
    with MODELS_CSV.open() as f:
        names = [row["gpu_model"] for row in csv.DictReader(f)]
    assert len(names) == len(set(names))
    assert [n for n in names if CATALOG.model(n) is None] == []
    # A blank cell keeps the default: the largest per-GPU count, the NVIDIA prefix.
    l40s = model("L40S")
    assert (l40s.sriov_totalvfs, l40s.mdev_name_prefix) == (32, "NVIDIA")
    assert model("A2").sriov_totalvfs == 16 and model("Tesla T4").mdev_name_prefix == "GRID"


# Mixed-size placement ----------------------------------------------------------------


def test_mixed_sizes_are_placed_largest_first_on_size_aligned_slots() -> None:
    l40s = model("L40S")
    assert grid(l40s) == (48, 1024)
    result = place(l40s, {"L40S-12Q": 2, "L40S-24Q": 1})
    assert result == Placement(
        slots=48,
        vgpus=(
            PlacedVgpu("L40S-24Q", 0, 24),
            PlacedVgpu("L40S-12Q", 24, 12),
            PlacedVgpu("L40S-12Q", 36, 12),
        ),
    )
    assert [v.type_name for v in result.new] == ["L40S-24Q", "L40S-12Q", "L40S-12Q"]
    assert result.used == 48
    # The RTX PRO 6000's 3 GB and 4 GB types: slots of their common divisor, 1 GiB.
    assert grid(model(PRO6000)) == (96, 1024)
    pro = place(model(PRO6000), {"DC-3Q": 2, "DC-4Q": 1, "DC-48Q": 1})
    assert isinstance(pro, Placement)
    assert [(v.type_name, v.start) for v in pro.vgpus] == [
        ("DC-48Q", 0), ("DC-4Q", 48), ("DC-3Q", 54), ("DC-3Q", 57),
    ]  # fmt: skip


def test_an_infeasible_mix_says_which_types_and_sizes() -> None:
    l40s = model("L40S")
    assert place(l40s, {"L40S-24Q": 2, "L40S-12Q": 2}) == (
        "L40S-24Q × 2 (24576 MiB, 24 slots each), L40S-12Q × 2 (12288 MiB, 12 slots each) "
        "need 72 slots of 1024 MiB; one L40S has 48 (49152 MiB)"
    )
    assert place(l40s, {"L40S-1Q": 32, "L40S-8Q": 1}) == (
        "33 vGPUs need 33 virtual functions; one L40S has 32"
    )
    assert place(l40s, {"L40S-16Q": 4}) == "L40S-16Q: 4 exceeds 3, the most one L40S holds"
    assert place(l40s, {"L40S-1-24Q": 1}) == "L40S-1-24Q is not a vGPU type of the L40S"
    assert place(model(PRO6000), {"DC-1-24Q": 1}) == (
        "DC-1-24Q is MIG-backed; mixed-size mode places time-sliced types"
    )


def test_placement_beside_existing_vgpus_respects_their_slots_and_alignment() -> None:
    l40s = model("L40S")
    result = place(l40s, {"L40S-24Q": 1}, existing=[("L40S-12Q", 0)])
    assert isinstance(result, Placement)
    assert [(v.type_name, v.start, v.existing) for v in result.vgpus] == [
        ("L40S-12Q", 0, True), ("L40S-24Q", 24, False),
    ]  # fmt: skip
    assert [v.type_name for v in result.new] == ["L40S-24Q"]
    # 46 slots are free, but no 24-slot run on a 24-slot boundary is.
    reason = place(l40s, {"L40S-24Q": 1}, existing=[("L40S-1Q", 0), ("L40S-1Q", 24)])
    assert reason == (
        "L40S-24Q × 1 (24576 MiB, 24 slots each): no free 24-slot run on a 24-slot boundary "
        "left for L40S-24Q (the L40S has 48 slots of 1024 MiB; placed largest first)"
    )
    assert place(l40s, {}, existing=[("L40S-12Q", 6)]) == (
        "the existing L40S-12Q at slot 6 is not on a 12-slot boundary of the L40S's 48 slots"
    )
    assert place(l40s, {}, existing=[("L40S-12Q", 0), ("L40S-6Q", 6)]) == (
        "the existing L40S-6Q at slot 6 overlaps another vGPU"
    )


def test_placement_is_deterministic() -> None:
    mix = {"L40S-1Q": 16, "L40S-2Q": 4, "L40S-4Q": 4, "L40S-8Q": 1}
    first = place(model("L40S"), mix)
    assert isinstance(first, Placement) and len(first.vgpus) == 25
    assert all(place(model("L40S"), dict(reversed(mix.items()))) == first for _ in range(3))
