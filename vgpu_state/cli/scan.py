"""``vgpu-state scan``: what the node's sysfs shows, as a table or JSON."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vgpu_state.catalog import default_catalog, type_sort_key
from vgpu_state.cli.options import DEFAULT_SYSFS_ROOT, output_option, sysfs_root_option
from vgpu_state.cli.output import console as make_console
from vgpu_state.cli.session import default_state_path, driver_type_memory
from vgpu_state.host import scan as scan_sysfs
from vgpu_state.model.errors import VgpuStateError
from vgpu_state.model.snapshot import Gpu, NodeSnapshot
from vgpu_state.reconcile import Settings


def _creatable_summary(gpu: Gpu) -> list[str]:
    """Per type: ``available_instances`` on the PF, or on how many free VFs it is offered."""
    on_pf = {t.name: t.available for t in gpu.pf_creatable}
    on_vfs: dict[str, int] = {}
    for vf in gpu.vfs:
        for t in vf.creatable:
            on_vfs[t.name] = on_vfs.get(t.name, 0) + 1
    by_size = {t.name: t.framebuffer_mib for t in gpu.offered}

    def order(item: tuple[str, int]) -> tuple[int, str]:
        return type_sort_key(item[0], by_size.get(item[0]))

    rows = [f"{name} ×{count}" for name, count in sorted(on_pf.items(), key=order)]
    rows += [
        f"{name} (on {n} VF{'s' if n != 1 else ''})"
        for name, n in sorted(on_vfs.items(), key=order)
    ]
    return rows


def _dash(value: object) -> str:
    """A value for a table cell; ``-`` when sysfs did not show it."""
    return "-" if value is None else str(value)


def print_snapshot(snapshot: NodeSnapshot, console: Console) -> None:
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
        vgpus = [
            f"{v.type_name or v.type_id} {v.uuid or ''} on {v.parent}".replace("  ", " ")
            for v in gpu.vgpus
        ]
        table.add_row("vGPUs", "\n".join(vgpus) if vgpus else "none")
        creatable = _creatable_summary(gpu)
        table.add_row("creatable", ", ".join(creatable) if creatable else "none")
        if gpu.problems:
            table.add_row("problems", "\n".join(gpu.problems), style="yellow")
        console.print(table)
    for problem in snapshot.problems:
        line = Text("problem:", style="yellow")
        line.append(f" {problem}")
        console.print(line)


@click.command("scan")
@sysfs_root_option()
@click.option("--sim", "sim_spec", type=click.Path(dir_okay=False), help="Scan a simulated node.")
@output_option()
@click.option("--node", default="", help="Node name recorded in the snapshot.")
def scan(sysfs_root: str | None, sim_spec: str | None, output: str, node: str) -> None:
    """Show the node's NVIDIA GPUs, their vGPU layout, vGPUs and creatable types.

    Reads sysfs only; changes nothing.

    \b
    Examples:
      vgpu-state scan
      vgpu-state scan --sim configs/sim/mixed.yaml
      vgpu-state scan --sim configs/sim/mixed.yaml -o json
      vgpu-state scan --sysfs-root /host/sys --node gpu-7
    """
    if sim_spec is not None and sysfs_root is not None:
        raise click.UsageError("give either --sim or --sysfs-root, not both")
    try:
        catalog = default_catalog()
        # What the driver listed before names the vGPUs of a full GPU (docs/apply.md).
        memory = driver_type_memory(
            Settings(
                catalog=catalog,
                driver_types_path=default_state_path(None, sim_spec, "driver-types"),
            ),
            record=False,
        )
        if sim_spec is not None:
            from vgpu_state.sim.node import open_sim

            sim = open_sim(sim_spec, catalog=catalog, driver_types=memory)
            try:
                snapshot = sim.host.scan().model_copy(update={"sysfs_root": f"sim:{sim_spec}"})
                if node:
                    snapshot = snapshot.model_copy(update={"node": node})
            finally:
                sim.close()
        else:
            root = sysfs_root or DEFAULT_SYSFS_ROOT
            snapshot = memory.observe(scan_sysfs(root, node, catalog=catalog))
    except VgpuStateError as e:
        if output == "json":
            click.echo(json.dumps({"error": {"reason": e.reason.value, "message": str(e)}}))
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if output == "json":
        click.echo(snapshot.model_dump_json(indent=2))
    else:
        # Names and values come from sysfs and spec files: print them as text, never markup.
        print_snapshot(snapshot, make_console(markup=False, soft_wrap=False))
    if snapshot.error is not None:
        click.echo(f"error: {snapshot.error}", err=True)
        sys.exit(1)
