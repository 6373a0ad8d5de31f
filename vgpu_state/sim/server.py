"""The simulator's own entry point: ``python -m vgpu_state.sim mount|sriov-manage|nvidia-smi``.

The FUSE server runs in a process of its own (a mount is served until it is
unmounted), and tests start it without the ``vgpu-state`` command. The CLI's
``vgpu-state sim`` commands call the same functions.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vgpu_state.model.errors import VgpuStateError


def mount(spec_path: str, mountpoint: str, save: bool, foreground: bool) -> int:
    """Serve the spec at ``mountpoint`` (forks to the background unless ``foreground``)."""
    from vgpu_state.catalog import default_catalog
    from vgpu_state.sim.fuse import fuse_unavailable_reason, serve
    from vgpu_state.sim.sysfs import SimSysfs
    from vgpu_state.sim.writelog import load_node

    reason = fuse_unavailable_reason()
    if reason:
        print(f"error: cannot mount: {reason}", file=sys.stderr)
        return 1
    try:
        catalog = default_catalog()
        spec = load_node(Path(spec_path), catalog)[0]
        SimSysfs(spec, catalog)
    except VgpuStateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    os.makedirs(mountpoint, exist_ok=True)
    if not foreground and os.fork() != 0:
        return 0
    serve(spec, mountpoint, catalog, save_to=spec_path if save else None)
    return 0


def sriov_manage(root: str, flag: str, target: str) -> int:
    """Do what ``/usr/lib/nvidia/sriov-manage FLAG TARGET`` does, on a mounted simulator."""
    from vgpu_state.sim.tree import SRIOV_MANAGE_CONTROL, SRIOV_MANAGE_OUTPUT

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
            print(f"{root} is not a simulator mount with sriov-manage", file=sys.stderr)
            return 1
        status = 1
    try:
        with open(os.path.join(root, SRIOV_MANAGE_OUTPUT), encoding="utf-8") as f:
            output = f.read().strip()
    except OSError:
        output = ""
    if output:
        print(output, file=sys.stderr if status else sys.stdout)
    return status


def nvidia_smi(root: str, args: Sequence[str]) -> int:
    """Do what ``nvidia-smi ARGS`` does, on a mounted simulator: print its output and
    return its exit status."""
    from vgpu_state.sim.tree import NVIDIA_SMI_CONTROL, NVIDIA_SMI_OUTPUT, NVIDIA_SMI_STATUS

    if any(not a or any(c.isspace() for c in a) for a in args):
        print("nvidia-smi (simulated): arguments may not be empty or hold spaces", file=sys.stderr)
        return 2
    try:
        fd = os.open(os.path.join(root, NVIDIA_SMI_CONTROL), os.O_WRONLY)
        try:
            os.write(fd, " ".join(args).encode())
        finally:
            os.close(fd)
        with open(os.path.join(root, NVIDIA_SMI_STATUS), encoding="utf-8") as f:
            status = int(f.read().strip() or "0")
        with open(os.path.join(root, NVIDIA_SMI_OUTPUT), encoding="utf-8") as f:
            output = f.read().rstrip("\n")
    except (OSError, ValueError) as e:
        if isinstance(e, OSError) and e.errno == errno.ENOENT:
            print(f"{root} is not a simulator mount with nvidia-smi", file=sys.stderr)
        else:
            print(f"nvidia-smi (simulated): {e}", file=sys.stderr)
        return 1
    if output:
        print(output)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vgpu_state.sim")
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("mount", help="Serve a simulated /sys through FUSE.")
    m.add_argument("--spec", required=True)
    m.add_argument("mountpoint")
    m.add_argument("--save", action="store_true")
    m.add_argument("--foreground", action="store_true")
    s = commands.add_parser("sriov-manage", help="sriov-manage on a mounted simulator.")
    s.add_argument("--root", required=True)
    group = s.add_mutually_exclusive_group(required=True)
    group.add_argument("-e", dest="enable", metavar="BDF|ALL")
    group.add_argument("-d", dest="disable", metavar="BDF|ALL")
    n = commands.add_parser(
        "nvidia-smi", help="nvidia-smi on a mounted simulator: nvidia-smi --root ROOT ARGS..."
    )
    n.add_argument("--root", required=True)
    # The tool's own arguments look like options (-q, -i): kept as they come.
    args, rest = parser.parse_known_args(argv)
    if args.command == "nvidia-smi":
        return nvidia_smi(args.root, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "mount":
        return mount(args.spec, args.mountpoint, args.save, args.foreground)
    if args.enable is not None:
        return sriov_manage(args.root, "-e", args.enable)
    return sriov_manage(args.root, "-d", args.disable)
