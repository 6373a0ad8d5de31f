"""``vgpu-state scan``: what the node's sysfs shows, as a table or JSON."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vgpu_state.catalog import Catalog, default_catalog
from vgpu_state.cli.common import parse_in_use
from vgpu_state.cli.errors import report
from vgpu_state.cli.options import (
    node_option,
    nvidia_smi_option,
    output_option,
    proc_root_option,
    sim_option,
    state_dir_option,
    sysfs_root_option,
)
from vgpu_state.cli.output import console as make_console
from vgpu_state.cli.session import nvidia_smi_command, warn
from vgpu_state.cli.session import state_dir as session_state_dir
from vgpu_state.compose import NodeSettings, open_node
from vgpu_state.model.errors import VgpuStateError
from vgpu_state.model.gpumode import GpuModes
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu
from vgpu_state.model.withheld import WithheldRecord, WithheldVgpu, still_on_host
from vgpu_state.planner.fits import still_fits
from vgpu_state.reconcile.once import holders
from vgpu_state.statefiles import WithheldFile


class Withheld:
    """The vGPUs the node's agent recorded as withheld that the scan still shows with the
    same type (:func:`~vgpu_state.model.withheld.still_on_host`), and when it recorded them."""

    def __init__(self, record: WithheldRecord | None, snapshot: NodeSnapshot) -> None:
        self.record = record
        self.vgpus: Mapping[str, WithheldVgpu] = (
            still_on_host(record, snapshot) if record is not None else {}
        )

    def why(self, key: str) -> str | None:
        """``withheld (<reason>; config <name>; recorded by the agent at <time>)``."""
        w = self.vgpus.get(key)
        if w is None or self.record is None:
            return None
        config = f"; config {w.config}" if w.config else ""
        return f"withheld ({w.reason}{config}; recorded by the agent at {self.record.written})"

    def per_type(self) -> dict[str, int]:
        return dict(sorted(Counter(w.type for w in self.vgpus.values()).items()))


def _fits_rows(gpu: Gpu, catalog: Catalog) -> str:
    """Per type: how many more fit now (each count alone), and on how many free VFs."""
    listed = [f for f in still_fits(gpu, catalog) if f.count > 0]
    if not listed:
        return "none"
    line = ", ".join(f"{f.type} ×{f.count}" for f in listed)
    notes = []
    if len(listed) > 1:
        notes.append("each count alone")
    free = {f.free_vfs for f in listed if f.free_vfs is not None}
    if len(free) == 1:
        n = free.pop()
        notes.append(f"{n} free VF{'s' if n != 1 else ''}")
    return line + (f"\n({'; '.join(notes)})" if notes else "")


def _dash(value: object) -> str:
    """A value for a table cell; ``-`` when sysfs did not show it."""
    return "-" if value is None else str(value)


def _modes_text(modes: GpuModes) -> str:
    """A GPU's mode as ``nvidia-smi`` read it, with its GPU instances (id, profile,
    placement start:size)."""
    text = modes.mode.value
    if modes.mig is not None:
        text += f" (MIG mode {'on' if modes.mig else 'off'}"
        if modes.mig_pending is not None and modes.mig_pending != modes.mig:
            text += f", {'on' if modes.mig_pending else 'off'} after a GPU reset"
        text += ")"
    lines = [text]
    for gi in modes.gpu_instances:
        where = ""
        if gi.placement_start is not None:
            where = f" at {gi.placement_start}:{gi.placement_size or '?'}"
        lines.append(f"GPU instance {gi.id}: {gi.profile}{where}")
    return "\n".join(lines)


def _landed(v: Vgpu) -> str:
    """Where the driver put a VF's vGPU (its GPU instance, its placement), when read."""
    parts = []
    if v.gpu_instance_id is not None:
        parts.append(f"GPU instance {v.gpu_instance_id}")
    if v.placement_id is not None:
        parts.append(f"placement {v.placement_id}")
    return f" ({', '.join(parts)})" if parts else ""


def print_snapshot(
    snapshot: NodeSnapshot,
    console: Console,
    held: Mapping[str, str] | None = None,
    catalog: Catalog | None = None,
    withheld: Withheld | None = None,
) -> None:
    """The snapshot as one table per GPU; ``held``: vGPU key → holder; ``withheld``: what
    the node's agent recorded as not offered."""
    held = held or {}
    withheld = withheld or Withheld(None, snapshot)
    catalog = catalog or default_catalog()
    title = f"node {snapshot.node or '(unnamed)'} — sysfs {snapshot.sysfs_root}"
    if not snapshot.gpus:
        console.print(f"{title}: no NVIDIA GPUs found")
    for gpu in snapshot.gpus:
        table = Table(
            title=f"GPU {gpu.index} {gpu.address}", show_header=False, title_justify="left"
        )
        table.add_column("field", style="bold")
        table.add_column("value")
        table.add_row("model", gpu.model or f"unknown (device 0x{gpu.device_id:04x})")
        table.add_row("driver", gpu.driver or "-")
        table.add_row("layout", f"{gpu.layout.value} ({gpu.layout_reason})")
        if gpu.sriov_totalvfs:
            table.add_row("VFs", f"{gpu.sriov_numvfs}/{gpu.sriov_totalvfs} enabled")
        table.add_row("NUMA / IOMMU", f"{_dash(gpu.numa_node)} / {_dash(gpu.iommu_group)}")
        if gpu.modes is not None:
            table.add_row("mode", _modes_text(gpu.modes))
        vgpus = [
            f"{v.type_name or v.type_id} {v.uuid or ''} on {v.parent}{_landed(v)}".replace(
                "  ", " "
            )
            for v in gpu.vgpus
        ]
        table.add_row("vGPUs", "\n".join(vgpus) if vgpus else "none")
        if gpu.vgpus:
            holding = [f"{v.key}: {held[v.key]}" for v in gpu.vgpus if v.key in held]
            free = len(gpu.vgpus) - len(holding)
            holding.append(f"{free} free" if holding else f"none of {len(gpu.vgpus)}")
            table.add_row("held", "\n".join(holding))
            marked = [(v.key, withheld.why(v.key)) for v in gpu.vgpus]
            lines = [f"{key}: {why}" for key, why in marked if why is not None]
            if lines:
                table.add_row("withheld", "\n".join(lines))
        table.add_row("still fits", _fits_rows(gpu, catalog))
        if gpu.problems:
            table.add_row("problems", "\n".join(gpu.problems), style="yellow")
        console.print(table)
    counts = withheld.per_type()
    if counts and withheld.record is not None:
        listed = ", ".join(f"{name} ×{n}" for name, n in counts.items())
        console.print(
            f"withheld: {listed} (free, not offered by the device plugin or DRA while the "
            f"layout switch is pending; recorded by the agent at {withheld.record.written})"
        )
    for problem in snapshot.problems:
        line = Text("problem:", style="yellow")
        line.append(f" {problem}")
        console.print(line)


@click.command("scan")
@sysfs_root_option()
@sim_option()
@output_option()
@node_option("The node's name recorded in the snapshot.")
@click.option(
    "--in-use",
    "in_use",
    multiple=True,
    metavar="KEY[=HOLDER]",
    help="A vGPU (mdev UUID or VF address) held by a pod or VM (repeatable).",
)
@click.option(
    "--in-use-file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="In-use vGPUs: a JSON object {key: holder} or lines 'KEY HOLDER'.",
)
@proc_root_option()
@state_dir_option()
@nvidia_smi_option()
def scan(
    sysfs_root: str | None,
    sim_spec: str | None,
    output: str,
    node: str | None,
    in_use: tuple[str, ...],
    in_use_file: str | None,
    proc_root: str | None,
    state_dir: str | None,
    nvidia_smi: str | None,
) -> None:
    """Show the node's NVIDIA GPUs, their vGPU layout, its vGPUs and which pod, VM or
    process holds each, and how many more vGPUs of each type still fit.

    Reads sysfs (and /proc for holders) and the node's state directory only; changes
    nothing. The free vGPUs the node's agent withholds while a layout switch is pending
    (in-use: evacuate) are marked "withheld" with why, from what the agent recorded
    (withheld.json in the state directory); a vGPU gone since, or now of another type,
    is not. `vgpu-state plan` and the node's VGPUNodeState status (capacity[].withheld,
    gpus[].switch) say the same from the config.

    \b
    Examples:
      vgpu-state scan
      vgpu-state scan --sim configs/sim/mixed.yaml
      vgpu-state scan --sim configs/sim/mixed.yaml -o json
      vgpu-state scan --sysfs-root /host/sys --node gpu-7
      vgpu-state scan --in-use 6c1e...=vm/default/win-1 --proc-root /host/proc
    """
    if sim_spec is not None and sysfs_root is not None:
        raise click.UsageError("give either --sim or --sysfs-root, not both")
    try:
        given = parse_in_use(in_use, in_use_file)
        catalog = default_catalog()
        files = session_state_dir(sim_spec, directory=state_dir)
        # What the driver listed before names the vGPUs of a full GPU (docs/apply.md).
        opened = open_node(
            NodeSettings(
                catalog,
                sim_spec=sim_spec,
                sysfs_root=sysfs_root,
                name=node or "",
                driver_types=files.driver_types,
                proc_root=proc_root,
                nvidia_smi=nvidia_smi_command(nvidia_smi),
            ),
            warn,
        )
        try:
            snapshot = opened.host.scan()
            if sim_spec is not None:
                snapshot = snapshot.model_copy(update={"sysfs_root": f"sim:{sim_spec}"})
                if node:
                    snapshot = snapshot.model_copy(update={"node": node})
            cluster = opened.cluster.with_overrides(in_use=given)
            held, warnings = holders(opened.processes, cluster, snapshot)
        finally:
            opened.close()
    except VgpuStateError as e:
        report(e.reason.value, e.kind.value, str(e))
    record, problem = WithheldFile(files.withheld).load()
    if problem is not None:
        warnings.append(problem)
    withheld = Withheld(record, snapshot)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if output == "json":
        click.echo(json.dumps(scan_json(snapshot, held, catalog, withheld), indent=2))
    else:
        # Names and values come from sysfs, spec and state files: print them as text, never
        # markup.
        console = make_console(markup=False, soft_wrap=False)
        print_snapshot(snapshot, console, held, catalog, withheld)
    if snapshot.error is not None:
        # The snapshot (on stdout) says what was read; the exit code says it is incomplete.
        click.echo(f"error: {snapshot.error}", err=True)
        sys.exit(1)


def scan_json(
    snapshot: NodeSnapshot,
    held: Mapping[str, str],
    catalog: Catalog,
    withheld: Withheld | None = None,
) -> dict[str, Any]:
    """The snapshot as JSON, each vGPU with ``held_by`` (its holder, or null) and each GPU
    with ``still_fits`` (per type: how many more fit now, each count alone).

    When the node's agent recorded withheld vGPUs the scan still shows: each of them has
    ``withheld`` (``reason``, ``config``, ``recorded_at``) and the snapshot ``withheld``
    (``recorded_at``, ``snapshot_fingerprint``, ``types``: count per type); absent
    otherwise."""
    data: dict[str, Any] = json.loads(snapshot.model_dump_json())
    marked = withheld.vgpus if withheld is not None else {}
    for gpu, out in zip(snapshot.gpus, data["gpus"], strict=True):
        out["still_fits"] = [f.model_dump(exclude_none=True) for f in still_fits(gpu, catalog)]
        for v, vout in zip(gpu.vgpus, out["vgpus"], strict=True):
            vout["held_by"] = held.get(v.key)
            w = marked.get(v.key)
            if w is not None and withheld is not None and withheld.record is not None:
                vout["withheld"] = {
                    "reason": w.reason,
                    "config": w.config,
                    "recorded_at": withheld.record.written,
                }
    if marked and withheld is not None and withheld.record is not None:
        data["withheld"] = {
            "recorded_at": withheld.record.written,
            "snapshot_fingerprint": withheld.record.snapshot_fingerprint,
            "types": withheld.per_type(),
        }
    return data
