"""``fleet plan -o markdown``: the fleet plan as a pull-request review comment.

A reviewer reads the summary first (nodes by outcome, vGPUs to create and
destroy, nodes per disruption level, capacity per resource before → after),
then what needs a decision (errors, unknown nodes, blocked and deferred items
with their holders), then the changes. Nodes whose changes are the same (the
same config and the same steps on the same GPUs, as nodes of one hardware model
and pool have) are one group with one table, so a thousand nodes read as a few
groups. A section or a group's node list longer than :data:`OPEN_ROWS` is
collapsed (``<details>``). The comment stays under :data:`COMMENT_LIMIT`
characters (a GitHub comment holds at most 65,536): what does not fit is left
out, last sections first, and the comment says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.plan import MODE_KINDS, ActionKind, Blocked, Disruption, Plan
from vgpu_state.model.policy import Publish
from vgpu_state.model.timestamps import rfc3339
from vgpu_state.reconcile.evacuation import FleetEvacuation, summary_text, withheld_text
from vgpu_state.reconcile.fleet import FleetTotals, NodeOutcome, NodePlan
from vgpu_state.render.plan import before_after, mode_step_text

OPEN_ROWS = 20
"""Rows of a section shown open; a longer section is collapsed."""
OPEN_NAMES = 10
"""Node names of a group shown in its heading; the rest are collapsed."""
LISTED_NAMES = 100
"""Node names of a group listed in its collapsed list; the rest are counted."""
COMMENT_LIMIT = 60_000
"""Characters of the comment; GitHub refuses a comment over 65,536."""


def _esc(text: str) -> str:
    """Text safe in a table cell, a heading or ``<summary>``: HTML's special characters
    as entities, Markdown's escaped, one line."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for c in "\\`*_[]|#~":
        text = text.replace(c, "\\" + c)
    return " ".join(text.split())


def _html(text: str) -> str:
    """Text safe inside an HTML block (``<summary>``), where Markdown is not read."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return " ".join(text.split())


def _code(text: str, html: bool = False) -> str:
    """Inline code: ``<code>`` with the text escaped for Markdown (tables, paragraphs) or,
    with ``html``, for an HTML block."""
    return f"<code>{_html(text) if html else _esc(text)}</code>"


def _n(value: int) -> str:
    return f"{value:,}"


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{_n(n)} {word if n == 1 else plural or word + 's'}"


def _source(source: str) -> str:
    return "node label" if source == "label" else source


# one node, rendered (in a worker process, possibly) -----------------------------------------
def _change_rows(plan: Plan) -> list[list[str]]:
    """(GPU, change, count, vGPU type) per GPU with steps: destroys, SR-IOV, creates."""
    rows: list[list[str]] = []
    for g in plan.gpus:
        actions = plan.gpu_actions(g.address)
        if not actions:
            continue
        counts: dict[tuple[ActionKind, str], int] = {}
        sriov: list[str] = []
        modes: list[str] = []
        for a in actions:
            if a.kind is ActionKind.ENABLE_SRIOV:
                sriov.append(str((a.after or {}).get("sriov_numvfs", "")))
                continue
            if a.kind in MODE_KINDS:
                modes.append(_esc(mode_step_text(a)))
                continue
            key = (a.kind, a.type_label)
            counts[key] = counts.get(key, 0) + 1
        gpu = f"{_code(g.address)} {_esc(g.model or 'unknown model')}"
        mine: list[list[str]] = []
        for (kind, type_name), n in counts.items():
            if kind is ActionKind.DESTROY:
                mine.append(["destroy", str(n), _esc(type_name)])
        mine.extend(["enable SR-IOV", vfs, "virtual functions"] for vfs in sriov)
        mine.extend([text, "", ""] for text in modes)
        for (kind, type_name), n in counts.items():
            if kind is ActionKind.CREATE:
                mine.append(["create", str(n), _esc(type_name)])
        mine.append(["keep", str(g.kept), "vGPU(s) unchanged"])
        for i, row in enumerate(mine):
            rows.append([gpu if i == 0 else "", *row])
    return rows


def _capacity_text(plan: Plan) -> str:
    parts = []
    for c in plan.capacity:
        if c.before == c.after:
            continue
        name = c.resource or c.type_name
        parts.append(f"{_code(name)} {before_after(c.before, c.after)}")
    return "; ".join(parts)


def _grouped(items: tuple[Blocked, ...]) -> Iterator[tuple[int, Blocked]]:
    """Blocked items in order; neighbours of one kind, type, holder and reason counted once."""
    i = 0
    while i < len(items):
        b = items[i]
        n = 1
        while i + n < len(items):
            o = items[i + n]
            if (o.gpu, o.kind, o.type_name, o.holder, o.reason) != (
                b.gpu,
                b.kind,
                b.type_name,
                b.holder,
                b.reason,
            ):
                break
            n += 1
        yield n, b
        i += n


def _attention_rows(n: NodePlan) -> list[list[str]]:
    """(node, GPU, item, count, vGPU type, held by, why) per blocked or deferred item."""
    assert n.plan is not None
    rows: list[list[str]] = []
    for count, b in _grouped(n.plan.blocked):
        deferred = b.code is BlockedReason.SWITCH_DEFERRED
        if b.kind is ActionKind.DESTROY:
            what = "kept (switch deferred)" if deferred else "cannot be destroyed"
        else:
            what = "create deferred" if deferred else "cannot be created"
        rows.append(
            [
                _code(n.node),
                _code(b.gpu) if b.gpu else "cluster",
                what,
                str(count),
                _esc(b.type_name or ""),
                _esc(b.holder or ""),
                _esc(b.reason),
            ]
        )
    for g in n.plan.gpus:
        d = g.deferred_switch
        if d is None:
            continue
        waits = ", ".join(d.waits_for) or f"{_plural(len(d.in_the_way), 'vGPU')} in the way"
        rows.append(
            [
                _code(n.node),
                _code(g.address),
                "layout switch deferred",
                str(d.creates),
                "to create then",
                _esc(waits),
                _esc(f"{_plural(d.kept, 'free vGPU')} kept until then"),
            ]
        )
    return rows


def _group_body(n: NodePlan) -> str:
    """What nodes with the same changes share: config, disruption, capacity, steps."""
    assert n.plan is not None
    plan = n.plan
    sel = plan.selection
    was = n.reported_config if n.reported_config and n.reported_config != sel.config else ""
    s = plan.summary
    steps = [f"+{s.create}" if s.create else "", f"−{s.destroy}" if s.destroy else ""]
    if s.sriov:
        steps.append(f"{s.sriov} SR-IOV")
    head = {
        "config": sel.config,
        "source": _source(sel.source),
        "was": was,
        "steps": " ".join(x for x in steps if x),
        "disruption": plan.disruption.level.value,
        "capacity": _capacity_text(plan),
    }
    table = _table(
        ["GPU", "change", "count", "vGPU type"], _change_rows(plan), right=frozenset({2})
    )
    return json.dumps({"head": head, "table": table}, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class MarkdownNode:
    """A node as the comment needs it (small; made where the node is planned)."""

    name: str
    outcome: str
    disruption: str
    body: str
    """The node's changes as its group shares them (JSON), empty without steps."""
    attention: tuple[tuple[str, ...], ...]
    problem: tuple[str, str]
    """(reason, message) of an unknown or failed node."""
    warnings: tuple[str, ...]


def markdown_node(n: NodePlan) -> MarkdownNode:
    plan = n.plan
    body = _group_body(n) if plan is not None and plan.has_changes else ""
    attention = tuple(tuple(r) for r in _attention_rows(n)) if plan is not None else ()
    return MarkdownNode(
        name=n.node,
        outcome=n.outcome.value,
        disruption=plan.disruption.level.value if plan is not None else "",
        body=body,
        attention=attention,
        problem=(n.reason, n.message),
        warnings=n.warnings,
    )


def encode(m: MarkdownNode) -> bytes:
    return json.dumps(
        [m.name, m.outcome, m.disruption, m.body, m.attention, m.problem, m.warnings],
        ensure_ascii=False,
    ).encode()


def decode(data: bytes) -> MarkdownNode:
    name, outcome, disruption, body, attention, problem, warnings = json.loads(data)
    return MarkdownNode(
        name,
        outcome,
        disruption,
        body,
        tuple(tuple(r) for r in attention),
        (problem[0], problem[1]),
        tuple(warnings),
    )


# the comment -----------------------------------------------------------------------------------
SHARES = {"problems": 0.15, "attention": 0.25, "warnings": 0.08, "moves": 0.15}
"""The largest part of :data:`COMMENT_LIMIT` each of these sections may take."""
UNCHANGED_RESERVE = 3_000
"""Characters kept for the list of unchanged nodes while the changes are added."""


def _row(row: Sequence[str]) -> str:
    return f"| {' | '.join(row)} |"


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], right: frozenset[int] = frozenset()
) -> str:
    align = "|".join("--:" if i in right else "---" for i in range(len(headers)))
    return "\n".join([_row(headers), f"|{align}|", *map(_row, rows)])


def _fitted(headers: Sequence[str], rows: Sequence[Sequence[str]], budget: int, what: str) -> str:
    """A table of as many of ``rows`` as fit in ``budget`` characters, then how many
    were left out."""
    lines = [_row(headers), "|" + "|".join("---" for _ in headers) + "|"]
    size = sum(len(line) + 1 for line in lines) + 200
    shown = 0
    for row in rows:
        line = _row(row)
        if size + len(line) + 1 > budget:
            break
        lines.append(line)
        size += len(line) + 1
        shown += 1
    text = "\n".join(lines)
    if shown < len(rows):
        text += (
            f"\n\n{_n(len(rows) - shown)} more {what} left out to keep the comment short: "
            "`vgpu-state fleet plan -o text` lists them all."
        )
    return text


def _details(summary: str, body: str, open_: bool) -> str:
    if open_:
        return body
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def _names(names: Sequence[str], limit: int = OPEN_NAMES, html: bool = False) -> str:
    shown = ", ".join(_code(x, html) for x in names[:limit])
    if len(names) <= limit:
        return shown
    return f"{shown} and {_n(len(names) - limit)} more"


@dataclass
class _Group:
    head: dict[str, str]
    table: str
    names: list[str]


class Comment:
    """The comment's parts, in order, within :data:`COMMENT_LIMIT` characters."""

    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit

    @property
    def left(self) -> int:
        return self.limit - self.size

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text) + 2

    def text(self) -> str:
        return "\n\n".join(self.parts) + "\n"


class MarkdownWriter:
    """``fleet plan -o markdown``: each node reduced to what the comment shows as it is
    planned (:class:`MarkdownNode`: a few hundred bytes a node; nodes with the same
    changes share one table); the comment is written at the end, its summary first."""

    def __init__(self, source: str = "", limit: int | None = None) -> None:
        self.source = source
        self.limit = limit or COMMENT_LIMIT
        self.nodes: list[MarkdownNode] = []

    def render(self, n: NodePlan) -> tuple[str, None, bytes]:
        return n.node, None, encode(markdown_node(n))

    def store(self, rendered: tuple[str, object, object]) -> None:
        _, _, piece = rendered
        assert isinstance(piece, bytes)  # rendered by render(): never spooled elsewhere
        self.nodes.append(decode(piece))

    def add(self, n: NodePlan) -> None:
        self.nodes.append(markdown_node(n))

    def close(self) -> None:
        self.nodes = []

    def finish(self, result: FleetTotals, config_file: str, out: TextIO) -> None:
        out.write(self.comment(result, config_file))

    def comment(self, result: FleetTotals, config_file: str) -> str:
        nodes = sorted(self.nodes, key=lambda m: m.name)
        c = Comment(self.limit - 400)  # the closing line
        c.add(self._summary(result, config_file))
        if result.totals.capacity:
            c.add(self._capacity(result))
        ev = result.totals.evacuation
        if ev is not None and (ev.total or ev.withheld):
            c.add(moves_section(ev, min(c.left, int(self.limit * SHARES["moves"]))))
        problems = [m for m in nodes if m.outcome in (NodeOutcome.ERROR, NodeOutcome.UNKNOWN)]
        if problems:
            c.add(self._problems(problems, int(self.limit * SHARES["problems"])))
        attention = [r for m in nodes for r in m.attention]
        if attention:
            on = len({m.name for m in nodes if m.attention})
            heading = (
                f"#### Blocked and deferred: {_plural(len(attention), 'item')} on "
                f"{_plural(on, 'node')}"
            )
            headers = ["node", "GPU", "item", "count", "vGPU type", "held by", "why"]
            budget = min(c.left, int(self.limit * SHARES["attention"]))
            body = _fitted(headers, attention, budget, "items")
            c.add(f"{heading}\n\n" + _details("the items", body, len(attention) <= OPEN_ROWS))
        warned = [[_code(m.name), _esc(w)] for m in nodes for w in m.warnings]
        if warned:
            heading = f"#### Warnings: {_plural(len(warned), 'warning')}"
            budget = min(c.left, int(self.limit * SHARES["warnings"]))
            body = _fitted(["node", "warning"], warned, budget, "warnings")
            c.add(f"{heading}\n\n" + _details("the warnings", body, len(warned) <= OPEN_ROWS))
        unchanged = [m.name for m in nodes if m.outcome == NodeOutcome.NO_CHANGES]
        self._changes(c, nodes, UNCHANGED_RESERVE if unchanged else 0)
        if unchanged:
            c.add(self._unchanged(unchanged, c.left))
        c.add("<sub>vgpu-state fleet plan: nothing was changed.</sub>")
        return c.text()

    def _summary(self, result: FleetTotals, config_file: str) -> str:
        t = result.totals
        source = f" ({_esc(self.source)})" if self.source else ""
        levels = ", ".join(f"{_n(n)} {level.value}" for level, n in t.disruption)
        return "\n".join(
            [
                f"### vgpu-state fleet plan of {_code(config_file)}",
                "",
                f"**{_plural(t.nodes, 'node')}:** {_n(t.changed)} with changes, "
                f"{_n(t.unchanged)} unchanged, {_n(t.unknown)} unknown, "
                f"{_plural(t.errors, 'error')}. "
                f"**vGPUs:** {_n(t.create)} to create, {_n(t.destroy)} to destroy, "
                f"{_n(t.sriov)} SR-IOV to enable, {_n(t.blocked)} blocked.",
                "",
                f"**Disruption** (planned nodes per level): {levels}."
                + self._disruption_note(result),
                "",
                f"The fleet as of {rfc3339(result.now)}{source}; each node planned against "
                "the scan and holders its agent last reported.",
            ]
        )

    def _disruption_note(self, result: FleetTotals) -> str:
        levels = dict(result.totals.disruption)
        if levels.get(Disruption.GPU) or levels.get(Disruption.DEVICE):
            return " On a `device` node vGPUs are destroyed, one by one."
        return " Nothing is destroyed."

    def _capacity(self, result: FleetTotals) -> str:
        rows = []
        for cap in result.totals.capacity:
            name = cap.resource or f"{cap.type_name} (resource name not known yet)"
            notes = []
            if cap.publish is Publish.DRA:
                notes.append("DRA")
            if cap.after == 0 and cap.before > 0:
                notes.append("**none left**")
            rows.append(
                [
                    _code(name),
                    before_after(cap.before, cap.after),
                    _n(cap.held),
                    _n(cap.nodes),
                    "; ".join(notes),
                ]
            )
        headers = ["resource", "vGPUs before → after", "held", "nodes", "notes"]
        return "#### Capacity\n\n" + _table(headers, rows, right=frozenset({1, 2, 3}))

    def _problems(self, problems: list[MarkdownNode], budget: int) -> str:
        errors = sum(m.outcome == NodeOutcome.ERROR for m in problems)
        heading = (
            f"#### Not planned: {_plural(errors, 'error')}, {_n(len(problems) - errors)} unknown"
        )
        rows = [
            [_code(m.name), m.outcome, _code(m.problem[0]), _esc(m.problem[1])] for m in problems
        ]
        body = _fitted(["node", "outcome", "reason", "message"], rows, budget, "nodes")
        return f"{heading}\n\n" + _details("the nodes", body, len(rows) <= OPEN_ROWS)

    def _changes(self, c: Comment, nodes: list[MarkdownNode], reserve: int) -> None:
        groups: dict[str, _Group] = {}
        for m in nodes:
            if not m.body:
                continue
            group = groups.get(m.body)
            if group is None:
                decoded = json.loads(m.body)
                group = groups[m.body] = _Group(decoded["head"], decoded["table"], [])
            group.names.append(m.name)
        if not groups:
            return
        changed = sum(len(g.names) for g in groups.values())
        ordered = sorted(
            groups.values(),
            key=lambda g: (-Disruption(g.head["disruption"]).rank, -len(g.names), g.names[0]),
        )
        c.add(
            f"#### Changes: {_plural(changed, 'node')} in {_plural(len(ordered), 'group')} "
            "of nodes with the same changes"
        )
        open_ = len(ordered) <= OPEN_ROWS
        for i, g in enumerate(ordered):
            text = self._group(g, open_)
            if len(text) + 2 > c.left - reserve - 300:
                rest = ordered[i:]
                names = sum(len(x.names) for x in rest)
                c.add(
                    f"{_plural(len(rest), 'more group')} ({_plural(names, 'node')}) left out "
                    "to keep the comment short: `vgpu-state fleet plan -o text` shows "
                    f"every node; the first of them: {_names([x.names[0] for x in rest])}."
                )
                return
            c.add(text)

    def _group(self, g: _Group, open_: bool) -> str:
        h = g.head

        def title(html: bool) -> str:
            source = _html(h["source"]) if html else _esc(h["source"])
            config = f"config {_code(h['config'], html)} (by {source})"
            if h["was"]:
                config += f", was {_code(h['was'], html)}"
            return (
                f"<b>{_plural(len(g.names), 'node')}</b>, {config}: {h['steps']}, "
                f"disruption {h['disruption']}: {_names(g.names, OPEN_NAMES, html)}"
            )

        parts = []
        if len(g.names) > OPEN_NAMES:
            every = _names(g.names, LISTED_NAMES)
            parts.append(_details(f"the {_n(len(g.names))} nodes", every, False))
        if h["capacity"]:
            parts.append(f"Capacity of each node: {h['capacity']}")
        parts.append(g.table)
        body = "\n\n".join(parts)
        if open_:
            return f"{title(False)}\n\n{body}"
        return _details(title(True), body, False)

    def _unchanged(self, names: list[str], budget: int) -> str:
        heading = f"#### Unchanged: {_plural(len(names), 'node')}"
        listed: list[str] = []
        size = len(heading) + 200
        for name in names:
            size += len(name) + 17
            if size > budget:
                break
            listed.append(_code(name))
        text = ", ".join(listed)
        if len(listed) < len(names):
            text += f" and {_n(len(names) - len(listed))} more"
        return f"{heading}\n\n" + _details("the nodes", text, len(names) <= OPEN_ROWS)


def moves_section(ev: FleetEvacuation, budget: int) -> str:
    """The moves of ``in-use: evacuate``: each VM that would move and where there is room,
    the moves that cannot happen and why, and the capacity withheld meanwhile."""
    parts = [f"#### Moves (in-use: evacuate): {_esc(summary_text(ev))}"]
    rows = []
    for m in ev.moves:
        who = _code(m.vm) if m.vm is not None else _esc(m.holder)
        if m.possible:
            more = f" and {_n(m.more_targets)} more" if m.more_targets else ""
            where = ", ".join(_code(t) for t in m.targets) + more
        else:
            where = f"**cannot move**: {_esc(m.reason)}"
        rows.append([who, _code(m.node), _code(m.gpu), _esc(m.type_label), where])
    if rows:
        headers = ["VM or holder", "leaves", "GPU", "vGPU type", "free on"]
        body = _fitted(headers, rows, max(budget - 1_000, 500), "moves")
        if ev.left_out:
            body += f"\n\n{_plural(ev.left_out, 'more move')} not listed."
        parts.append(_details("the moves", body, len(rows) <= OPEN_ROWS))
    for r in ev.resources:
        if r.moving > r.free:
            parts.append(
                f"**{_esc(r.type_name)}**: {_plural(r.moving, 'VM')} would move, "
                f"{_plural(r.free, 'free vGPU')} of {_code(r.resource)} after the plans: "
                "some wait until more is free."
            )
    if ev.withheld:
        listed = "; ".join(_esc(withheld_text(w)) for w in ev.withheld[:OPEN_ROWS])
        hidden = len(ev.withheld) - OPEN_ROWS
        parts.append(
            "**Withheld during the change** (free vGPUs not offered while a switch is "
            f"pending): {listed}" + (f" and {_n(hidden)} more" if hidden > 0 else "") + "."
        )
    return "\n\n".join(parts)
