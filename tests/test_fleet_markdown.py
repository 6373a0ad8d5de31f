"""``fleet plan --from SNAPSHOT -o markdown``: the review comment a pull request shows.

The fleets here are snapshot files written as ``docs/gitops.md`` describes the
format, each node's status built by the status writer's own pieces from a scan
of a simulated node (as ``bench/fleet.py`` builds them), so the planning is the
real one; the assertions are on the Markdown text a reviewer reads. A fleet
planned against a real API server is in ``tests/test_fleet_snapshot.py``.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.test_fleet_plan import CONFIG, HELD_A2, _scan
from vgpu_state.cli import fleet_markdown
from vgpu_state.cli.main import cli
from vgpu_state.kube.nodestate import VGPUNodeStateStatus, encode_snapshot, layout_status
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import ConfigState

TAKEN = datetime.datetime(2026, 11, 25, 6, 0, tzinfo=datetime.UTC)


def _status(snapshot: NodeSnapshot, held: dict[str, str]) -> dict[str, Any]:
    gpus, capacity = layout_status(snapshot, held)
    return VGPUNodeStateStatus(
        state=ConfigState.SUCCESS,
        gpus=gpus,
        capacity=capacity,
        vgpu_count=sum(len(g.vgpus) for g in gpus),
        snapshot=encode_snapshot(snapshot, TAKEN - datetime.timedelta(minutes=5)),
    ).to_json()


class SnapshotFile:
    """A fleet snapshot written record by record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.nodes: dict[str, dict[str, str]] = {}
        self.states: list[dict[str, Any]] = []
        self.scans: dict[str, NodeSnapshot] = {}

    def add(
        self,
        name: str,
        labels: dict[str, str],
        spec: str | None,
        held: dict[str, str] | None = None,
    ) -> None:
        self.nodes[name] = labels
        record: dict[str, Any] = {"kind": "VGPUNodeState", "name": name}
        if spec is not None:
            scan = self.scans.get(spec)
            if scan is None:  # one simulated node per spec, reported under each name
                scan = self.scans[spec] = _scan(spec, "node")
            record["status"] = _status(scan.model_copy(update={"node": name}), held or {})
        self.states.append(record)

    def write(self) -> Path:
        lines: list[dict[str, Any]] = [
            {
                "kind": "vgpu-state-fleet-snapshot",
                "format_version": "1",
                "taken_at": "2026-11-25T06:00:00Z",
                "source": {"server": "https://prod.example:6443", "context": "prod"},
            },
            *({"kind": "Node", "name": n, "labels": v} for n, v in sorted(self.nodes.items())),
            *sorted(self.states, key=lambda r: r["name"]),
            {"kind": "end", "nodes": len(self.nodes), "states": len(self.states)},
        ]
        self.path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return self.path


def _plan(tmp_path: Path, snapshot: Path, *args: str) -> Result:
    config = tmp_path / "layouts.yaml"
    config.write_text(CONFIG)
    argv = ["fleet", "plan", "-f", str(config), "--from", str(snapshot), "--jobs", "1", *args]
    return CliRunner().invoke(cli, argv)


def _markdown(tmp_path: Path, snapshot: Path) -> str:
    done = _plan(tmp_path, snapshot, "-o", "markdown")
    assert done.exit_code in (0, 1), done.output
    return done.stdout


def _section(text: str, heading: str) -> str:
    """The text under the ``####`` heading that starts with ``heading``, its Markdown
    escapes removed (``NVIDIA\\_A2`` reads ``NVIDIA_A2``)."""
    match = re.search(rf"^#### {re.escape(heading)}.*?(?=^#### |\Z)", text, re.M | re.S)
    assert match is not None, f"no section {heading!r} in:\n{text[:3000]}"
    return re.sub(r"\\(.)", r"\1", match.group(0))


def _big_fleet(path: Path, count: int = 1000) -> SnapshotFile:
    """``count`` nodes: mixed nodes (every tenth with its A2 vGPU held by a VM), T4 pairs in
    the t4 pool, T4 pairs as they are, a few that have not reported, one nothing selects."""
    fleet = SnapshotFile(path)
    for i in range(count):
        name = f"gpu-{i:04d}"
        if i % 200 == 199:
            fleet.add(name, {"pool": "t4"}, None)  # not reported yet
        elif i == 500:
            fleet.add(name, {"zone": "c"}, "t4-pair.yaml")  # nothing selects a config
        elif i % 3 == 0:
            held = {HELD_A2: f"vm tenant-{i % 7}/desktop-{i}"} if i % 10 == 0 else {}
            fleet.add(name, {"nvidia.com/vgpu.config": "mixed"}, "mixed.yaml", held)
        elif i % 3 == 1:
            fleet.add(name, {"pool": "t4"}, "t4-pair.yaml")
        else:
            fleet.add(name, {"nvidia.com/vgpu.config": "t4-as-is"}, "t4-pair.yaml")
    fleet.write()
    return fleet


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """A 1,000-node snapshot, its comment and its ``-o json`` plan."""
    tmp = tmp_path_factory.mktemp("big")
    snapshot = _big_fleet(tmp / "fleet.jsonl").path
    comment = _markdown(tmp, snapshot)
    plan = json.loads(_plan(tmp, snapshot, "-o", "json").stdout)
    yield snapshot, comment, plan


def test_a_thousand_nodes_read_as_a_summary_then_a_few_groups(
    big: tuple[Path, str, dict[str, Any]],
) -> None:
    _, text, plan = big
    t = plan["totals"]
    assert len(text) < 65_536  # what a GitHub comment holds
    head = text.split("\n#### ", 1)[0]
    assert head.startswith("### vgpu-state fleet plan of <code>")
    assert (
        f"**1,000 nodes:** {t['changed']} with changes, {t['unchanged']} unchanged, "
        f"{t['unknown']} unknown, 1 error." in head
    )
    assert f"**vGPUs:** {t['create']:,} to create, {t['destroy']:,} to destroy" in head
    levels = ", ".join(f"{n} {level}" for level, n in t["disruption"].items())
    assert f"**Disruption** (planned nodes per level): {levels}." in head
    assert "The fleet as of 2026-11-25T06:00:00Z (snapshot of https://prod.example:6443" in head
    # Sections in the order a reviewer needs them.
    order = ["Capacity", "Not planned", "Blocked and deferred", "Changes", "Unchanged"]
    found = [h for h in re.findall(r"^#### (\w[\w ]*?)(?::|$)", text, re.M)]
    assert found == order, found
    # Nodes with the same changes are one group: 1,000 nodes, three kinds of change.
    changes = _section(text, "Changes")
    groups = re.search(r"#### Changes: ([\d,]+) nodes in (\d+) groups", changes)
    assert groups is not None
    assert int(groups.group(2)) <= 4
    assert (
        groups.group(1)
        == f"{sum(1 for n in plan['nodes'] if n['plan'] and n['plan']['actions']):,}"
    )
    # A group's many nodes are collapsed, its table is shown once.
    assert (
        "<details><summary>the 332 nodes</summary>" in changes
        or "<details><summary>the 33" in changes
    )
    assert changes.count("| GPU | change | count | vGPU type |") == int(groups.group(2))


def test_capacity_before_and_after_per_resource(big: tuple[Path, str, dict[str, Any]]) -> None:
    _, text, plan = big
    capacity = _section(text, "Capacity")
    for c in plan["totals"]["capacity"]:
        before_after = f"{c['before']} → {c['after']}"
        if c["after"] != c["before"]:
            before_after += f" ({c['after'] - c['before']:+d})"
        row = f"| <code>{c['resource']}</code> | {before_after} | {c['held']} | {c['nodes']} |"
        assert row in capacity, (row, capacity)


def test_blocked_items_name_their_holders_and_collapse_past_the_threshold(
    big: tuple[Path, str, dict[str, Any]],
) -> None:
    _, text, plan = big
    blocked = _section(text, "Blocked and deferred")
    held = [n["node"] for n in plan["nodes"] if n["plan"] and n["plan"]["blocked"]]
    assert len(held) > fleet_markdown.OPEN_ROWS
    items = plan["totals"]["blocked"]  # each a vGPU of its own here: none counted together
    assert blocked.startswith(f"#### Blocked and deferred: {items} items on {len(held)} nodes")
    assert "<details><summary>the items</summary>" in blocked
    first = held[0]
    i = int(first.split("-")[1])
    row = next(line for line in blocked.splitlines() if f"<code>{first}</code>" in line)
    assert "cannot be destroyed" in row and f"vm tenant-{i % 7}/desktop-{i}" in row


def test_nodes_not_planned_say_why(big: tuple[Path, str, dict[str, Any]]) -> None:
    _, text, _ = big
    section = _section(text, "Not planned")
    assert section.startswith("#### Not planned: 1 error, 5 unknown")
    assert "| <code>gpu-0500</code> | error | <code>NoConfigSelected</code> |" in section
    assert "| <code>gpu-0199</code> | unknown | <code>NoStatus</code> |" in section


def test_a_small_fleet_is_shown_open(tmp_path: Path) -> None:
    fleet = SnapshotFile(tmp_path / "fleet.jsonl")
    fleet.add("node-a", {"nvidia.com/vgpu.config": "mixed"}, "mixed.yaml", {HELD_A2: "vm a/b"})
    fleet.add("node-b", {"pool": "t4"}, "t4-pair.yaml")
    fleet.add("node-c", {"nvidia.com/vgpu.config": "t4-as-is"}, "t4-pair.yaml")
    text = _markdown(tmp_path, fleet.write())
    assert "<details>" not in text
    assert "**3 nodes:** 2 with changes, 1 unchanged, 0 unknown, 0 errors." in text
    changes = _section(text, "Changes")
    assert (
        "<b>1 node</b>, config <code>t4-quarters</code> (by node-selector[0]): +6, "
        "disruption none: <code>node-b</code>\n\n"
        "Capacity of each node: <code>nvidia.com/GRID_T4-4Q</code> 2 → 8 (+6)\n\n"
        "| GPU | change | count | vGPU type |\n"
        "|---|---|--:|---|\n"
        "| <code>0000:3b:00.0</code> Tesla T4 | create | 2 | T4-4Q |\n"
        "|  | keep | 2 | vGPU(s) unchanged |\n"
        "| <code>0000:af:00.0</code> Tesla T4 | create | 4 | T4-4Q |\n"
    ) in changes
    assert "<b>1 node</b>, config <code>mixed</code> (by node label): +2, disruption none" in (
        changes
    )
    assert "Nothing is destroyed." in text
    blocked = _section(text, "Blocked and deferred")
    assert "| <code>node-a</code> |" in blocked and "| vm a/b |" in blocked
    assert _section(text, "Unchanged").startswith("#### Unchanged: 1 node\n\n<code>node-c</code>\n")


def test_names_from_the_cluster_cannot_break_the_comment(tmp_path: Path) -> None:
    fleet = SnapshotFile(tmp_path / "fleet.jsonl")
    holder = "vm x/a|b <script>alert(1)</script> *bold* `tick`"
    fleet.add("node-a", {"nvidia.com/vgpu.config": "mixed"}, "mixed.yaml", {HELD_A2: holder})
    text = _markdown(tmp_path, fleet.write())
    row = next(line for line in text.splitlines() if "cannot be destroyed" in line)
    assert "<script>" not in text
    assert (
        "&lt;script&gt;" in row and "a\\|b" in row and "\\*bold\\*" in row and "\\`tick\\`" in row
    )
    # Still seven cells: the holder's | is escaped.
    assert len(re.split(r"(?<!\\)\|", row.strip("|"))) == 7


def test_what_does_not_fit_is_left_out_and_said(
    big: tuple[Path, str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot, whole, _ = big
    monkeypatch.setattr(fleet_markdown, "COMMENT_LIMIT", 6_000)
    text = _markdown(tmp_path, snapshot)
    assert len(text) <= 6_000
    # The summary and the capacity are whole; lists are cut, saying so.
    head = text.split("\n", 1)[1].split("\n#### Not planned", 1)[0]
    assert whole.split("\n", 1)[1].split("\n#### Not planned", 1)[0] == head
    assert "more items left out to keep the comment short" in text
    assert "`vgpu-state fleet plan -o text`" in text
    assert text.rstrip().endswith("<sub>vgpu-state fleet plan: nothing was changed.</sub>")
