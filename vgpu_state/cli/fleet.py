"""``vgpu-state fleet plan``: the cluster-wide dry run of a config file. Writes nothing.

Every node with a ``VGPUNodeState`` is planned as its agent would plan it:
the config selected by the Node's live labels, against the scan and holders
its agent last reported (see :mod:`vgpu_state.reconcile.fleet`).
"""

from __future__ import annotations

import collections
import datetime
import gc
import itertools
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TextIO

import click
from pydantic_core import to_json

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import (
    STRICT_ENTRIES_HELP,
    SuggestingGroup,
    chunk_size_option,
    config_file_option,
    default_config_option,
    kubeconfig_options,
    output_option,
    strict_option,
)
from vgpu_state.config.document import ConfigDocument
from vgpu_state.kube.fleet import DEFAULT_CHUNK_SIZE, Page
from vgpu_state.kube.nodestate import SnapshotDecoder
from vgpu_state.model.errors import TransientError
from vgpu_state.model.plan import MODE_KINDS, Action, ActionKind, Blocked, GpuPlan, Plan
from vgpu_state.model.policy import Publish
from vgpu_state.model.snapshot import SharedParts
from vgpu_state.reconcile.evacuation import document_evacuates, evacuation_lines
from vgpu_state.reconcile.fleet import (
    FleetPlan,
    FleetSummary,
    FleetTotals,
    NodeOutcome,
    NodePlan,
    fleet_header,
    node_document,
)
from vgpu_state.reconcile.settings import Settings
from vgpu_state.render.plan import before_after, mode_step_text
from vgpu_state.render.sharedjson import SharedJson

DEFAULT_MAX_AGE = "30m"
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> datetime.timedelta | None:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d``; ``0`` accepts any age (``None``)."""
    match = _DURATION.match(text)
    if match is None:
        raise click.BadParameter(
            f"{text!r}: expected a duration such as 90s, 15m, 2h or 0", param_hint="--max-age"
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    return datetime.timedelta(seconds=seconds) if seconds else None


@click.group("fleet", cls=SuggestingGroup)
def fleet() -> None:
    """Commands over every node of a cluster.

    \b
    Examples:
      vgpu-state fleet plan -f layouts.yaml
    """


@fleet.command("plan")
@config_file_option(required=True)
@kubeconfig_options()
@click.option(
    "--from",
    "snapshot",
    type=click.Path(dir_okay=False),
    help="Plan from this fleet snapshot (vgpu-state fleet snapshot), without any cluster "
    "access, as of the moment it was taken.",
)
@output_option(
    ("text", "json", "markdown", "table"),
    help="text: a table per changed node and the fleet's table; json: one document; "
    "markdown: a pull-request review comment (docs/gitops.md); table: the old name of text.",
)
@click.option(
    "--max-age",
    default=DEFAULT_MAX_AGE,
    show_default=True,
    help="A node whose last scan is older is unknown (0: any age).",
)
@chunk_size_option(DEFAULT_CHUNK_SIZE)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=0),
    default=0,
    help="Processes that plan nodes in parallel when the fleet spans more than one page "
    "(default 0: one per CPU, at most 4; 1: none).",
)
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="Exit 0 with no changes, 1 on error or unknown nodes, 2 when there are changes.",
)
@default_config_option()
@strict_option(STRICT_ENTRIES_HELP)
@handle_errors
def plan_cmd(
    config_file: str,
    kubeconfig: str | None,
    context: str | None,
    snapshot: str | None,
    output: str,
    max_age: str,
    chunk_size: int,
    jobs: int,
    detailed_exitcode: bool,
    default_config: str | None,
    strict: bool,
) -> None:
    """Plan every node that reports a VGPUNodeState against CONFIG (reads only).

    Each node gets the config its live labels select, planned against the scan
    and holders its agent last reported. Exit codes: 0 every node planned (or
    listed as unknown), 1 an error (the config, the cluster, or a node whose
    plan fails); with --detailed-exitcode 0 means every node is known and
    unchanged, 2 changes or blocked items, 1 also any unknown node.

    The fleet is read page by page (--chunk-size objects per request) and each
    node is planned and summarised as it is read, so memory does not grow with
    the fleet's size beyond a line per node; when there is more than one page, they
    are planned by --jobs processes while the next are read.

    With --from FILE the fleet is read from a snapshot file instead of the
    cluster, and node ages (--max-age) count from the moment it was taken: the
    output is the one planning against the cluster then would have printed.

    \b
    Examples:
      vgpu-state fleet plan -f layouts.yaml
      vgpu-state fleet plan -f layouts.yaml --kubeconfig ~/.kube/config --context prod
      vgpu-state fleet plan -f layouts.yaml -o json > fleet-plan.json
      vgpu-state fleet plan -f layouts.yaml --detailed-exitcode || echo "changes: $?"
    """
    from vgpu_state.catalog import default_catalog
    from vgpu_state.cli.fleet_snapshot import FleetSource
    from vgpu_state.cli.session import config_source

    limit = parse_duration(max_age)
    from vgpu_state.config import check_default_config

    settings = Settings(
        catalog=default_catalog(), default_config=default_config or None, strict=strict
    )
    document = config_source(config_file, settings).document()
    check_default_config(document, settings.default_config)
    source = FleetSource.open(snapshot, kubeconfig, context)
    now = source.now
    if output == "table":
        click.echo(
            "warning: -o table is deprecated and will be removed in the next release: use -o text",
            err=True,
        )
        output = "text"
    colour = output == "text" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    writer: FleetWriter
    if output == "markdown":
        from vgpu_state.cli.fleet_markdown import MarkdownWriter

        writer = MarkdownWriter(source.description)
    else:
        writer = JsonWriter() if output == "json" else TableWriter(colour)
    summary = FleetSummary(document_evacuates(document))
    try:
        with gc_paused():
            try:
                # A page at a time, each node decoded, planned and rendered into the
                # writer's spool, counted, then dropped. Nothing is printed before the
                # last node is read.
                labels, pages = source.read(chunk_size)
                work = PageWork(document, settings, now, limit, labels, writer)
                for part, rendered in plan_pages(work, pages, jobs or default_jobs()):
                    summary.merge(part)
                    for one in rendered:
                        writer.store(one)
            finally:
                source.close()
            result = FleetTotals(summary.totals(), now, limit)
            writer.finish(result, config_file, sys.stdout)
    finally:
        writer.close()
    sys.exit(exit_code(result, detailed_exitcode))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a fleet is read and planned.

    A thousand decoded scans and plans are hundreds of thousands of objects, none
    of them cyclic garbage; the collector's full passes over them doubled the time.
    Meant for the end of a command: what exists when it ends is never collected as
    cyclic garbage afterwards (``gc.freeze``); it is still freed when unreferenced.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # The command ends right after: freeze what it built, so that re-enabling the
        # collector does not start with a full pass over all of it (0.4 s for 1,000 nodes).
        gc.freeze()
        if collecting:
            gc.enable()


def exit_code(result: FleetTotals | FleetPlan, detailed: bool) -> int:
    """0 / 1 / 2 as the command's help and docs/cluster.md say."""
    if result.totals.errors:
        return 1
    if not detailed:
        return 0
    if result.totals.unknown:
        return 1
    return 2 if result.has_changes else 0


# rendering ---------------------------------------------------------------------------------
# Plain aligned tables with ANSI colours on a terminal. A thousand nodes print in a few
# hundredths of a second; rich's tables took seconds for the same output.
ANSI = {
    "green": "32",
    "red": "31",
    "yellow": "33",
    "magenta": "35",
    "bold": "1",
    "bold red": "1;31",
    "bold magenta": "1;35",
    "dim": "2",
}
OUTCOME_STYLE = {
    NodeOutcome.CHANGES: "yellow",
    NodeOutcome.NO_CHANGES: "green",
    NodeOutcome.UNKNOWN: "magenta",
    NodeOutcome.ERROR: "bold red",
}
MARK_STYLE = {"+": "green", "-": "red", "~": "yellow", "!": "bold magenta"}

Cell = str | tuple[str, str]
"""A table cell: text, or (text, style name)."""


def _paint(text: str, style: str, colour: bool) -> str:
    if not colour or not style or not text:
        return text
    return f"\x1b[{ANSI[style]}m{text}\x1b[0m"


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    right: frozenset[int] = frozenset(),
    colour: bool = False,
) -> list[str]:
    """Aligned columns with a header rule; the last column is not padded."""
    plain = [[c if isinstance(c, str) else c[0] for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in plain:
        for i, text in enumerate(row):
            if len(text) > widths[i]:
                widths[i] = len(text)
    last = len(headers) - 1

    def line(cells: Sequence[Cell], texts: Sequence[str]) -> str:
        out = []
        for i, (cell, text) in enumerate(zip(cells, texts, strict=True)):
            pad = widths[i] - len(text)
            style = "" if isinstance(cell, str) else cell[1]
            shown = _paint(text, style, colour)
            if i in right:
                out.append(" " * pad + shown)
            else:
                out.append(shown if i == last else shown + " " * pad)
        return " │ ".join(out).rstrip()

    lines = [_paint(line(headers, headers), "bold", colour)]
    lines.append("─┼─".join("─" * w for w in widths))
    if colour:
        lines.extend(line(cells, texts) for cells, texts in zip(rows, plain, strict=True))
        return lines
    # Without colour a cell is its text, padded: the same lines, a row at a time.
    pads = [
        str.rjust if i in right else (None if i == last else str.ljust) for i in range(len(widths))
    ]
    for texts in plain:
        if len(texts) != len(widths):
            raise ValueError(f"a row of {len(texts)} cells in a table of {len(widths)} columns")
        lines.append(
            " │ ".join(
                [
                    text if pad is None else pad(text, width)
                    for text, pad, width in zip(texts, pads, widths, strict=True)
                ]
            ).rstrip()
        )
    return lines


def _source(source: str) -> str:
    if source == "label":
        return "node label"
    return source


def _time(moment: datetime.datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _heading(n: NodePlan) -> str:
    text = n.node
    if n.plan is not None:
        sel = n.plan.selection
        text += f': config "{sel.config}" (by {_source(sel.source)})'
        if n.reported_config and n.reported_config != sel.config:
            text += f', was "{n.reported_config}"'
    if n.scanned_at is not None:
        text += f", scanned {_time(n.scanned_at)}"
    return text


def _gpu_name(g: GpuPlan) -> str:
    return f"{g.address} {g.model or 'unknown model'}"


def _grouped_blocked(items: Sequence[Blocked]) -> Iterator[tuple[int, Blocked]]:
    """Blocked items; creates of one type with one reason collapse into a count."""
    i = 0
    while i < len(items):
        b = items[i]
        n = 1
        if b.kind is not ActionKind.DESTROY:
            while (
                i + n < len(items)
                and items[i + n].kind is b.kind
                and (items[i + n].type_name, items[i + n].reason) == (b.type_name, b.reason)
            ):
                n += 1
        yield n, b
        i += n


def node_rows(plan: Plan) -> Iterator[tuple[Cell, ...]]:
    """(GPU, mark, count, vGPU type, detail) rows: actions counted by kind and type,
    blocked items with their reason (a held vGPU names its holder)."""
    actions_of: dict[str, list[Action]] = {}
    for a in plan.actions:
        actions_of.setdefault(a.gpu, []).append(a)
    blocked_of: dict[str, list[Blocked]] = {}
    for b in plan.blocked:
        blocked_of.setdefault(b.gpu, []).append(b)
    for g in plan.gpus:
        blocked = blocked_of.get(g.address, [])
        actions = actions_of.get(g.address, [])
        if not actions and not blocked:
            continue
        counts: dict[tuple[ActionKind, str], int] = {}
        sriov: list[str] = []
        for a in actions:
            if a.kind is ActionKind.ENABLE_SRIOV:
                after = (a.after or {}).get("sriov_numvfs")
                sriov.append(f"enable SR-IOV: {after} virtual functions")
                continue
            if a.kind in MODE_KINDS:
                sriov.append(mode_step_text(a))
                continue
            key = (a.kind, a.type_label)
            counts[key] = counts.get(key, 0) + 1
        name = _gpu_name(g)
        rows: list[tuple[str, str, str, str]] = []
        for (kind, type_name), n in counts.items():
            if kind is ActionKind.DESTROY:
                rows.append(("-", str(n), type_name, "destroy"))
        rows.extend(("~", "", "", line) for line in sriov)
        for (kind, type_name), n in counts.items():
            if kind is ActionKind.CREATE:
                rows.append(("+", str(n), type_name, "create"))
        for n, b in _grouped_blocked(blocked):
            what = "cannot be destroyed" if b.kind is ActionKind.DESTROY else "cannot be created"
            rows.append(("!", str(n), b.type_name or "", f"{what}: {b.reason}"))
        for mark, count, type_name, detail in rows:
            style = MARK_STYLE[mark]
            yield name, (mark, style), count, type_name, (detail, style)
            name = ""
        kept = f"{g.kept} vGPU(s) unchanged" if g.managed else "not managed by this config"
        yield "", "", "", "", (kept, "dim")


NODE_HEADERS = ("GPU", " ", "count", "vGPU type", "detail")
FLEET_HEADERS = (
    "node",
    "config",
    "outcome",
    "create",
    "destroy",
    "SR-IOV",
    "blocked",
    "disruption",
    "note",
)


def _summary(plan: Plan | None) -> tuple[str, str, str, str, str]:
    if plan is None:
        return "", "", "", "", ""
    s = plan.summary
    return str(s.create), str(s.destroy), str(s.sriov), str(s.blocked), plan.disruption.level.value


def fleet_row(n: NodePlan) -> tuple[Cell, ...]:
    """A node on one line: config, outcome, counts, and why for unknown and errors."""
    config = n.plan.selection.config if n.plan is not None else ""
    if n.reported_config and n.plan is not None and n.reported_config != config:
        config = f"{config} (was {n.reported_config})"
    note = f"{n.reason}: {n.message}" if n.reason else "; ".join(n.warnings)
    outcome = (n.outcome.value, OUTCOME_STYLE[n.outcome])
    return (n.node, config, outcome, *_summary(n.plan), note.replace("\n", " "))


def fleet_rows(result: FleetPlan) -> Iterator[tuple[Cell, ...]]:
    """Every node on one line (see :func:`fleet_row`)."""
    for n in result.nodes:
        yield fleet_row(n)


def totals_line(result: FleetTotals | FleetPlan) -> str:
    t = result.totals
    return (
        f"Fleet: {t.nodes} node(s): {t.changed} with changes, {t.unchanged} unchanged, "
        f"{t.unknown} unknown, {t.errors} error(s). "
        f"{t.create} to create, {t.destroy} to destroy, {t.sriov} SR-IOV to enable, "
        f"{t.blocked} blocked."
    )


def fleet_capacity_lines(result: FleetTotals | FleetPlan) -> list[str]:
    """The fleet's capacity per resource (now → after) and its nodes per disruption level."""
    t = result.totals
    lines: list[str] = []
    if t.capacity:
        names = [c.resource or f"{c.type_name} (resource name not known yet)" for c in t.capacity]
        counts = [before_after(c.before, c.after) for c in t.capacity]
        width, count_width = max(map(len, names)), max(map(len, counts))
        lines.append("Capacity across the planned nodes (vGPUs per resource, now → after):")
        for c, name, count in zip(t.capacity, names, counts, strict=True):
            notes = [f"on {c.nodes} node(s)"]
            if c.publish is Publish.DRA:
                notes.append("DRA")
            if c.held:
                notes.append(f"{c.held} held")
            if c.after == 0 and c.before > 0:
                notes.append("none left")
            lines.append(f"  {name:<{width}}  {count:<{count_width}}  [{'; '.join(notes)}]")
    levels = ", ".join(f"{n} {level.value}" for level, n in t.disruption)
    lines.append(f"Disruption: nodes per level: {levels}.")
    return lines


def node_lines(n: NodePlan, colour: bool = False) -> list[str]:
    """A node that would change: its heading, its table and its warnings."""
    if n.outcome is not NodeOutcome.CHANGES or n.plan is None:
        return []
    lines = [_paint(_heading(n), "bold", colour)]
    lines += format_table(
        NODE_HEADERS, list(node_rows(n.plan)), right=frozenset({2}), colour=colour
    )
    lines += [_paint(f"  warning: {w}", "yellow", colour) for w in n.warnings]
    return lines


def header_line(result: FleetTotals | FleetPlan, config_file: str) -> str:
    return (
        f"Fleet plan of {config_file}: {result.totals.nodes} node(s) with a VGPUNodeState, "
        "each planned against the scan and holders it last reported. Nothing is changed."
    )


def render_table(result: FleetPlan, config_file: str, out: TextIO, colour: bool = False) -> None:
    """A table per node that would change, then every node on a line, then the totals."""
    writer = TableWriter(colour)
    try:
        for n in result.nodes:
            writer.add(n)
        writer.finish(result.summary, config_file, out)
    finally:
        writer.close()


# streaming output --------------------------------------------------------------------------
class Spooled(NamedTuple):
    """A piece of output that a worker process wrote to its own spool file."""

    path: str
    start: int
    size: int


class Spool:
    """Pieces of output by node name, kept in an unnamed temporary file (or the spool
    files of the worker processes that rendered them) and read back in name order: a
    fleet's output is printed only once it is complete (its first lines are the
    totals), without holding every node's part in memory meanwhile."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 - closed by close()
        self._fds = [self._file.fileno()]
        self._opened: dict[str, int] = {}
        """A worker's spool file -> its place in ``_fds`` (opened once, when first met)."""
        self._index: list[tuple[str, int, int, int]] = []
        """(node name, file, start, size) per piece."""
        self._end = 0
        self._pending = bytearray()
        """Pieces not written yet (written :data:`_BATCH` bytes at a time)."""

    def __len__(self) -> int:
        return len(self._index)

    def add(self, name: str, data: bytes | Spooled) -> None:
        if isinstance(data, Spooled):
            f = self._opened.get(data.path)
            if f is None:
                f = self._opened[data.path] = len(self._fds)
                self._fds.append(os.open(data.path, os.O_RDONLY | os.O_CLOEXEC))
            self._index.append((name, f, data.start, data.size))
            return
        # The file is unbuffered and the pending bytes are written by this object alone:
        # a worker forked later inherits no file buffer that would write them again.
        self._pending += data
        self._index.append((name, 0, self._end, len(data)))
        self._end += len(data)
        if len(self._pending) >= _BATCH:
            self._flush()

    def _flush(self) -> None:
        with memoryview(self._pending) as data:
            written = 0
            while written < len(data):
                written += self._file.write(data[written:]) or 0
        self._pending.clear()

    def pieces(self) -> Iterator[bytes]:
        """Every piece, by node name (in the order added for equal names). Pieces that
        follow each other in one file are read together, up to :data:`_BATCH` bytes."""
        self._flush()
        index = self._index
        if any(a[0] > b[0] for a, b in itertools.pairwise(index)):
            index = sorted(index, key=lambda entry: entry[0])
        fds = self._fds
        run: list[int] = []
        run_file = run_start = run_end = 0
        for _, f, start, size in index:
            if run and (f != run_file or start != run_end or run_end - run_start >= _BATCH):
                yield from _split(os.pread(fds[run_file], run_end - run_start, run_start), run)
                run = []
            if not run:
                run_file, run_start, run_end = f, start, start
            run.append(size)
            run_end += size
        if run:
            yield from _split(os.pread(fds[run_file], run_end - run_start, run_start), run)

    def close(self) -> None:
        for fd in self._fds[1:]:
            os.close(fd)
        del self._fds[1:]
        self._opened.clear()
        self._file.close()


_BATCH = 1 << 20
"""Bytes of output a :class:`Spool` writes, or reads back, at a time."""


def _split(block: bytes, sizes: list[int]) -> Iterator[bytes]:
    """``block`` cut into pieces of ``sizes``."""
    at = 0
    for size in sizes:
        yield block[at : at + size]
        at += size


def _byte_writer(out: TextIO) -> Callable[[bytes], object]:
    """Writes UTF-8 text as bytes to ``out``: straight to its binary buffer when it has
    one and encodes in UTF-8 (a fleet's output is not decoded and encoded again), else
    decoded. Once it is taken, write to ``out`` only through it until done."""
    buffer = getattr(out, "buffer", None)
    encoding = (getattr(out, "encoding", None) or "").lower().replace("_", "-")
    if buffer is None or encoding not in ("utf-8", "utf8"):
        return lambda data: out.write(data.decode())
    out.flush()
    write: Callable[[bytes], object] = buffer.write
    return write


Rendered = tuple[str, tuple[Cell, ...] | None, bytes | Spooled | None]
"""A node rendered for a writer: its name, its fleet-table row, its part to spool (or
already spooled by a worker process)."""


class FleetWriter(Protocol):
    def render(self, n: NodePlan) -> Rendered: ...

    def store(self, rendered: Rendered) -> None: ...

    def add(self, n: NodePlan) -> None: ...

    def finish(self, result: FleetTotals, config_file: str, out: TextIO) -> None: ...

    def close(self) -> None: ...


class TableWriter:
    """``fleet plan``'s tables, built a node at a time: each changed node's table goes to
    the spool as the node is planned; the fleet table keeps one row per node."""

    spools = True
    """Its pieces go to a :class:`Spool` (a worker process may write them to its own)."""

    def __init__(self, colour: bool = False) -> None:
        self.colour = colour
        self.spool = Spool()
        self.rows: list[tuple[str, tuple[Cell, ...]]] = []

    def render(self, n: NodePlan) -> Rendered:
        lines = node_lines(n, self.colour)
        piece = "".join(f"\n{line}" for line in ["", *lines]).encode() if lines else None
        return n.node, fleet_row(n), piece

    def store(self, rendered: Rendered) -> None:
        name, row, piece = rendered
        assert row is not None
        self.rows.append((name, row))
        if piece is not None:
            self.spool.add(name, piece)

    def add(self, n: NodePlan) -> None:
        self.store(self.render(n))

    def finish(self, result: FleetTotals, config_file: str, out: TextIO) -> None:
        out.write(header_line(result, config_file))
        write = _byte_writer(out)
        for piece in self.spool.pieces():
            write(piece)
        rows = self.rows
        if any(a[0] > b[0] for a, b in itertools.pairwise(rows)):
            rows = sorted(rows, key=lambda row: row[0])
        lines = [""]
        lines += format_table(
            FLEET_HEADERS, [r for _, r in rows], right=frozenset({3, 4, 5, 6}), colour=self.colour
        )
        lines += ["", *fleet_capacity_lines(result)]
        moves = evacuation_lines(result.totals.evacuation) if result.totals.evacuation else []
        lines += ["", *moves] if moves else []
        lines += [_paint(totals_line(result), "bold", self.colour)]
        write(("".join(f"\n{line}" for line in lines) + "\n").encode())

    def close(self) -> None:
        self.spool.close()


class JsonWriter:
    """``fleet plan -o json``, built a node at a time: each node's part of ``nodes`` is
    serialised as the node is planned (indented as in the whole document) and spooled;
    the totals, which come first, are written at the end."""

    spools = True

    def __init__(self) -> None:
        self.spool = Spool()
        # The parts many nodes' plans share (GPU headers, capacity rows, a pool's
        # vendor-VFIO steps) are serialised once: the same bytes as to_json of each.
        self.json = SharedJson()

    def render(self, n: NodePlan) -> Rendered:
        text = self.json.document(node_document(n, plan_as_model=True), "plan", 2)
        return n.node, None, b"    " + text

    def store(self, rendered: Rendered) -> None:
        name, _, piece = rendered
        assert piece is not None
        self.spool.add(name, piece)

    def add(self, n: NodePlan) -> None:
        self.store(self.render(n))

    def finish(self, result: FleetTotals, config_file: str, out: TextIO) -> None:
        # pydantic's serializer: a thousand plans in a tenth of the time of json.dumps.
        head = to_json(fleet_header(result, config_file), indent=2)
        assert head.endswith(b"\n}")
        out.write(head[:-2].decode())
        if not len(self.spool):
            out.write(',\n  "nodes": []\n}\n')
            return
        out.write(',\n  "nodes": [\n')
        write = _byte_writer(out)
        first = True
        for piece in self.spool.pieces():
            if not first:
                write(b",\n")
            write(piece)
            first = False
        write(b"\n  ]\n}\n")

    def close(self) -> None:
        self.spool.close()


# planning pages, here or in worker processes ------------------------------------------------
@dataclass
class PageWork:
    """What planning a page of nodes needs; worker processes get it by ``fork``."""

    document: ConfigDocument
    settings: Settings
    now: datetime.datetime
    max_age: datetime.timedelta | None
    labels: Mapping[str, Mapping[str, str]]
    writer: FleetWriter
    decoder: SnapshotDecoder = field(default_factory=SnapshotDecoder)

    @property
    def writer_spools(self) -> bool:
        """Whether the writer keeps its pieces in a :class:`Spool`."""
        return bool(getattr(self.writer, "spools", False))


class FleetWorkerError(TransientError):
    """A worker process died while it planned a page of the fleet."""


_WORK: PageWork | None = None
"""The work of this process (the command's, inherited by its workers)."""


class _WorkerSpool:
    """A worker process's own spool file: the pieces of output it rendered go there,
    and only where they are (:class:`Spooled`) goes back to the command, which reads
    them from the file when it prints (no copy through the pipe and the command's
    spool)."""

    def __init__(self, directory: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix="worker-", dir=directory)
        self._file = os.fdopen(fd, "wb", buffering=0)
        self._end = 0

    def keep(self, rendered: list[Rendered]) -> list[Rendered]:
        data = memoryview(b"".join(p for _, _, p in rendered if isinstance(p, bytes)))
        written = 0
        while written < len(data):
            written += self._file.write(data[written:]) or 0
        kept: list[Rendered] = []
        for name, row, piece in rendered:
            if isinstance(piece, bytes):
                kept.append((name, row, Spooled(self.path, self._end, len(piece))))
                self._end += len(piece)
            else:
                kept.append((name, row, piece))
        return kept


_WORKER_SPOOL: _WorkerSpool | None = None
"""In a worker process: its spool file (when the writer spools its pieces)."""


def plan_page(page: Page) -> tuple[FleetSummary, list[Rendered]]:
    """A page of ``VGPUNodeState`` objects (or the list response's JSON text, decoded
    here): each decoded, planned and rendered in turn."""
    from vgpu_state.kube.fleet import reported_nodes
    from vgpu_state.reconcile.fleet import plan_node

    work = _WORK
    assert work is not None
    summary = FleetSummary(document_evacuates(work.document))
    out: list[Rendered] = []
    with SharedParts.remembering():
        for node in reported_nodes(page, work.labels, work.decoder):
            planned = plan_node(work.document, node, work.settings, work.now, work.max_age)
            del node
            summary.add(planned)
            out.append(work.writer.render(planned))
            del planned
    if _WORKER_SPOOL is not None:
        out = _WORKER_SPOOL.keep(out)
    return summary, out


def _worker_start(parent: int, spool_dir: str | None = None) -> None:
    """In a worker: end with the command, even when it is killed (Linux's parent-death
    signal); a worker would otherwise wait for work forever. With ``spool_dir``, the
    pieces it renders go to a spool file of its own there."""
    import ctypes
    import signal

    global _WORKER_SPOOL
    if spool_dir is not None:
        _WORKER_SPOOL = _WorkerSpool(spool_dir)
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != parent:  # the command ended before the signal was asked for
        os._exit(1)


def default_jobs() -> int:
    """Processes that plan pages: the CPUs this process may use, at most 4; 1 (none) where
    processes cannot be forked."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(4, len(os.sched_getaffinity(0))))


def plan_pages(
    work: PageWork, pages: Iterator[Page], jobs: int
) -> Iterator[tuple[FleetSummary, list[Rendered]]]:
    """Every page planned (:func:`plan_page`), in order. A fleet of one page is planned
    in this process; with ``jobs`` above 1 and more pages, ``jobs`` forked processes
    decode and plan them while this one reads the next pages and collects what they
    rendered. At most two pages per process wait, so memory stays a few pages."""
    global _WORK
    _WORK = work
    first = next(pages, None)
    if first is None:
        return
    second = next(pages, None) if jobs > 1 else None
    if second is None:
        yield plan_page(first)
        del first
        for page in pages:
            yield plan_page(page)
        return
    # A worker that dies (killed, out of memory) fails the command (BrokenProcessPool)
    # instead of leaving it waiting for a page that never comes.
    context = multiprocessing.get_context("fork")
    # Workers spool what they render in files of their own here; the writer opens each
    # as it stores the first piece from it, so the directory goes when the pages are done.
    spool_dir = tempfile.mkdtemp(prefix="vgpu-state-fleet-") if work.writer_spools else None
    with (
        _removed(spool_dir),
        ProcessPoolExecutor(
            jobs, mp_context=context, initializer=_worker_start, initargs=(os.getpid(), spool_dir)
        ) as pool,
    ):
        waiting: collections.deque[Future[tuple[FleetSummary, list[Rendered]]]]
        waiting = collections.deque()
        chained = itertools.chain((first, second), pages)
        del first, second
        try:
            for page in chained:
                waiting.append(pool.submit(plan_page, page))
                del page
                while len(waiting) > 2 * jobs:
                    yield waiting.popleft().result()
            while waiting:
                yield waiting.popleft().result()
        except BrokenProcessPool:
            raise FleetWorkerError(
                "a process planning the fleet stopped unexpectedly (killed, or out of "
                "memory?); nothing was printed: run the command again, or with --jobs 1"
            ) from None
        finally:
            for future in waiting:
                future.cancel()


@contextmanager
def _removed(directory: str | None) -> Iterator[None]:
    try:
        yield
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _register() -> None:
    from vgpu_state.cli.fleet_snapshot import snapshot_cmd

    fleet.add_command(snapshot_cmd)


_register()
