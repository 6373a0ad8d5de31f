"""``vgpu-state sim``: run the NVIDIA vGPU driver simulator."""

from __future__ import annotations

import errno
import os
import sys

import click

from vgpu_state.model.errors import VgpuStateError


@click.group("sim")
def sim() -> None:
    """The NVIDIA vGPU driver simulator (no GPU needed)."""


@sim.command("mount")
@click.option("--spec", "spec_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--save", is_flag=True, help="Write the final state back to the spec on exit.")
@click.option("--foreground", is_flag=True, help="Stay in the foreground (Ctrl-C unmounts).")
def mount(spec_path: str, mountpoint: str, save: bool, foreground: bool) -> None:
    """Serve a simulated /sys at MOUNTPOINT through FUSE.

    Writes by any process (echo UUID > …/create, echo 1 > …/remove, echo ID >
    …/current_vgpu_type) get the simulated driver's reactions and errno values.
    Stop with Ctrl-C, SIGTERM or fusermount3 -u MOUNTPOINT.
    """
    from vgpu_state.sim.fuse import fuse_unavailable_reason, serve
    from vgpu_state.sim.spec import load_spec

    reason = fuse_unavailable_reason()
    if reason:
        click.echo(f"error: cannot mount: {reason}", err=True)
        sys.exit(1)
    try:
        spec = load_spec(spec_path)
        from vgpu_state.sim.sysfs import SimSysfs

        SimSysfs(spec)
    except VgpuStateError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    os.makedirs(mountpoint, exist_ok=True)
    if not foreground and os.fork() != 0:
        return
    serve(spec, mountpoint, save_to=spec_path if save else None)


@sim.command("sriov-manage")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="A mounted sim.")
@click.option("-e", "enable", metavar="BDF|ALL", help="Enable the VFs of a GPU.")
@click.option("-d", "disable", metavar="BDF|ALL", help="Disable the VFs of a GPU.")
def sriov_manage(root: str, enable: str | None, disable: str | None) -> None:
    """Behave like /usr/lib/nvidia/sriov-manage on a FUSE-mounted simulator."""
    from vgpu_state.sim.tree import SRIOV_MANAGE_CONTROL, SRIOV_MANAGE_OUTPUT

    if (enable is None) == (disable is None):
        click.echo("usage: sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>", err=True)
        sys.exit(2)
    flag, target = ("-e", enable) if enable is not None else ("-d", disable)
    control = os.path.join(root, SRIOV_MANAGE_CONTROL)
    status = 0
    try:
        fd = os.open(control, os.O_WRONLY)
        try:
            os.write(fd, f"{flag} {target}".encode())
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            click.echo(f"{root} is not a simulator mount with sriov-manage", err=True)
            sys.exit(1)
        status = 1
    try:
        with open(os.path.join(root, SRIOV_MANAGE_OUTPUT), encoding="utf-8") as f:
            output = f.read().strip()
    except OSError:
        output = ""
    if output:
        click.echo(output, err=status != 0)
    sys.exit(status)
