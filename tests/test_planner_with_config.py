"""Planner cases driven by real config documents: device-filter, index and address selection."""

from __future__ import annotations

import pytest

from tests.builders import NODE, V, build_gpu, build_snapshot
from tests.test_planner_table import compact
from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.reconcile import Ports, Report, Settings, reconcile_once
from vgpu_state.reconcile.fleet import ReportedHost
from vgpu_state.testing import FakeCluster

CATALOG = default_catalog()

# A2 and A16 share device id 0x25b6; the subsystem id tells them apart.
MULTI_MODEL = """\
version: v1
policy: {prune: true}
vgpu-configs:
  pool:
    - devices: all
      device-filter: "0x25B610DE"
      vgpu-devices: {A2-4Q: 4}
    - devices: all
      device-filter: "0x25B610DE"
      vgpu-devices: {A16-2Q: 8}
    - devices: all
      device-filter: "0x1EB810DE"
      vgpu-devices: {T4-8Q: 2}
  by-index:
    - devices: [0]
      vgpu-devices: {A2-8Q: 2}
    - devices: [2]
      vgpu-devices: {T4-16Q: 1}
  by-address:
    - devices: ["3b:00.0"]
      vgpu-devices: {T4-2Q: 8}
  a2-only:
    - devices: all
      vgpu-devices: {A2-16Q: 1}
"""


def planned(text: str, snapshot: NodeSnapshot, config: str) -> Report:
    """Plan ``config`` of ``text`` for a node that scans as ``snapshot``."""
    ports = Ports(
        ReportedHost(snapshot),  # the scan as given; a write would raise
        FakeCluster(NODE),
        StaticConfigSource(load_text(text, "m", catalog=CATALOG)),
    )
    return reconcile_once(ports, Settings(catalog=default_catalog()), config_name=config)


def node() -> NodeSnapshot:
    return build_snapshot(
        build_gpu("0000:08:00.0", "A2", vgpus=[V("A2-4Q", 0)]),
        build_gpu("0000:21:00.0", "A16"),
        build_gpu("0000:3b:00.0", "T4"),
    )


@pytest.mark.parametrize(
    ("config", "expected", "unmanaged"),
    [
        (
            "pool",
            ["+A2-4Q@08:00.5", "+A2-4Q@08:00.6", "+A2-4Q@08:00.7"]
            + [f"+A16-2Q@21:{a}" for a in ["00.4", "00.5", "00.6", "00.7"]]
            + [f"+A16-2Q@21:{a}" for a in ["01.0", "01.1", "01.2", "01.3"]]
            + ["+T4-8Q@3b:00.0", "+T4-8Q@3b:00.0"],
            [],
        ),
        (
            "by-index",
            ["-A2-4Q@08:00.4", "+A2-8Q@08:00.4", "+A2-8Q@08:00.5", "+T4-16Q@3b:00.0"],
            ["0000:21:00.0"],
        ),
        ("by-address", ["+T4-2Q@3b:00.0"] * 8, ["0000:08:00.0", "0000:21:00.0"]),
        # "devices: all" covers only GPUs whose model offers every type of the entry.
        ("a2-only", ["-A2-4Q@08:00.4", "+A2-16Q@08:00.4"], ["0000:21:00.0", "0000:3b:00.0"]),
    ],
)
def test_config_selection_drives_the_plan(
    config: str, expected: list[str], unmanaged: list[str]
) -> None:
    report = planned(MULTI_MODEL, node(), config)
    assert list(report.inputs.desired.unmanaged) == unmanaged
    assert compact(report.plan) == expected


def test_unmanaged_gpu_with_vgpus_is_left_alone() -> None:
    snapshot = build_snapshot(
        build_gpu("0000:08:00.0", "A2"),
        build_gpu("0000:3b:00.0", "T4", vgpus=[V("T4-1Q"), V("T4-1Q")]),
    )
    p = planned(MULTI_MODEL, snapshot, "a2-only").plan
    assert compact(p) == ["+A2-16Q@08:00.4"]
    t4 = next(g for g in p.gpus if g.address == "0000:3b:00.0")
    assert (t4.managed, t4.kept) == (False, 2)


@pytest.mark.parametrize(
    ("policy_line", "expected"),
    [
        # The layout is the whole desired state: by default what it does not want goes.
        ("", ["-A2-4Q@08:00.4", "+A2-16Q@08:00.4"]),
        ("policy: {prune: true}\n", ["-A2-4Q@08:00.4", "+A2-16Q@08:00.4"]),
        # prune: false is the opt-in for additive layouts.
        ("policy: {prune: false}\n", ["!destroy A2-4Q", "!create A2-16Q"]),
    ],
)
def test_config_policy_reaches_the_plan(policy_line: str, expected: list[str]) -> None:
    text = MULTI_MODEL.replace("policy: {prune: true}\n", policy_line)
    assert compact(planned(text, node(), "a2-only").plan) == expected
