"""``vgpu-state sim``: run the NVIDIA vGPU driver simulator."""

from __future__ import annotations

import sys

import click

from vgpu_state.cli.options import SuggestingGroup


@click.group("sim", cls=SuggestingGroup)
def sim() -> None:
    """The NVIDIA vGPU driver simulator (no GPU needed).

    \b
    Examples:
      vgpu-state sim mount --spec configs/sim/a2-host.yaml /tmp/x --foreground
      vgpu-state sim sriov-manage --root /tmp/x -e ALL
    """


@sim.command("mount")
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The simulated node (docs/simulator.md), e.g. configs/sim/a2-host.yaml.",
)
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--save", is_flag=True, help="Write the final state back to the spec on exit.")
@click.option("--foreground", is_flag=True, help="Stay in the foreground (Ctrl-C unmounts).")
def mount(spec_path: str, mountpoint: str, save: bool, foreground: bool) -> None:
    """Serve a simulated /sys at MOUNTPOINT through FUSE.

    Writes by any process (echo UUID > …/create, echo 1 > …/remove, echo ID >
    …/current_vgpu_type) get the simulated driver's reactions and errno values.
    Stop with Ctrl-C, SIGTERM or fusermount3 -u MOUNTPOINT. Without --save the spec
    file is left as it was.

    \b
    Examples:
      vgpu-state sim mount --spec configs/sim/a2-host.yaml /tmp/x --foreground &
      vgpu-state scan --sysfs-root /tmp/x
      fusermount3 -u /tmp/x
    """
    from vgpu_state.sim.server import mount as serve_mount

    sys.exit(serve_mount(spec_path, mountpoint, save, foreground))


@sim.command("sriov-manage")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="A mounted sim.")
@click.option("-e", "enable", metavar="BDF|ALL", help="Enable the VFs of a GPU.")
@click.option("-d", "disable", metavar="BDF|ALL", help="Disable the VFs of a GPU.")
def sriov_manage(root: str, enable: str | None, disable: str | None) -> None:
    """Behave like /usr/lib/nvidia/sriov-manage on a FUSE-mounted simulator.

    \b
    Examples:
      vgpu-state sim sriov-manage --root /tmp/x -e 0000:08:00.0
      vgpu-state sim sriov-manage --root /tmp/x -d ALL
    """
    from vgpu_state.sim.server import sriov_manage as run_sriov_manage

    if (enable is None) == (disable is None):
        click.echo("usage: sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>", err=True)
        sys.exit(2)
    if enable is not None:
        sys.exit(run_sriov_manage(root, "-e", enable))
    assert disable is not None
    sys.exit(run_sriov_manage(root, "-d", disable))
