"""``vgpu-state deviceplugin``: serve the kubelet device plugin alone, in the foreground.

For trying the plugin and for nodes where another tool applies layouts. In a
process that applies layouts, the same ``DevicePluginManager`` is the
``DevicePluginSink`` that is refreshed with a fresh scan after every apply.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import click

from vgpu_state.cli.options import DEFAULT_SYSFS_ROOT, ENV_LOG_LEVEL, sysfs_root_option
from vgpu_state.model.errors import VgpuStateError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.wellknown import KUBELET_DEVICE_PLUGIN_DIR

if TYPE_CHECKING:
    from vgpu_state.deviceplugin import DevicePluginManager
    from vgpu_state.statefiles.drivertypes import DriverTypeMemory

DEFAULT_PLUGIN_DIR = KUBELET_DEVICE_PLUGIN_DIR


@click.command("deviceplugin")
@click.option(
    "--sim",
    "sim_spec",
    type=click.Path(exists=True, dir_okay=False),
    help="Advertise a simulated node; re-read when the spec file changes "
    "(vgpu-state apply --sim writes it).",
)
@sysfs_root_option(help="Advertise the vGPUs under this sysfs root (or --sim: a simulated node).")
@click.option(
    "--plugin-dir",
    envvar="VGPU_STATE_DEVICE_PLUGIN_DIR",
    help=f"The kubelet's device-plugins directory [default: {DEFAULT_PLUGIN_DIR}; "
    "a temporary one with --fake-kubelet]. Env: VGPU_STATE_DEVICE_PLUGIN_DIR.",
)
@click.option(
    "--domain",
    default="nvidia.com",
    show_default=True,
    help="Resource name prefix: <domain>/<type name>.",
)
@click.option(
    "--resync",
    type=click.FloatRange(min=0.05),
    default=30.0,
    show_default=True,
    help="Seconds between re-scans of --sysfs-root.",
)
@click.option(
    "--health-interval",
    type=click.FloatRange(min=0.05),
    default=2.0,
    show_default=True,
    help="Seconds between checks that each device is still there.",
)
@click.option(
    "--fake-kubelet",
    is_flag=True,
    help="Also run a stand-in kubelet in the plugin directory and print every "
    "device list it receives (no kubelet needed).",
)
def deviceplugin(
    sim_spec: str | None,
    sysfs_root: str | None,
    plugin_dir: str | None,
    domain: str,
    resync: float,
    health_interval: float,
    fake_kubelet: bool,
) -> None:
    """Serve one device plugin per vGPU type until Ctrl-C or SIGTERM.

    Each vGPU type on the node becomes the resource nvidia.com/<type name with
    spaces as _>, registered with the kubelet through <plugin dir>/kubelet.sock.
    On exit every resource first advertises an empty list.

    \b
    Examples:
      vgpu-state deviceplugin
      vgpu-state deviceplugin --sim configs/sim/a2-host.yaml --fake-kubelet
      vgpu-state deviceplugin --sysfs-root /host/sys
    """
    if sim_spec is not None and sysfs_root is not None:
        click.echo("error: give either --sim SPEC or --sysfs-root DIR, not both", err=True)
        sys.exit(1)
    if sim_spec is None:
        sysfs_root = sysfs_root or DEFAULT_SYSFS_ROOT
        if not os.path.isdir(sysfs_root):
            click.echo(f"error: --sysfs-root {sysfs_root}: no such directory", err=True)
            sys.exit(1)
    level = os.environ.get(ENV_LOG_LEVEL, "info").upper()
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    from vgpu_state.deviceplugin import DevicePluginManager

    temp_dir = None
    if plugin_dir is None and fake_kubelet:
        temp_dir = plugin_dir = tempfile.mkdtemp(prefix="vgpu-dp-", dir="/tmp")
    plugin_dir = plugin_dir or DEFAULT_PLUGIN_DIR
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    kubelet = None
    manager = DevicePluginManager(plugin_dir, domain=domain, health_interval=health_interval)
    source: _Source | None = None
    try:
        if fake_kubelet:
            from vgpu_state.testing.deviceplugin_kubelet import FakeKubelet, SeenDevice

            def show(resource: str, devices: tuple[SeenDevice, ...]) -> None:
                listed = ", ".join(f"{d.id} ({d.health})" for d in devices) or "no devices"
                click.echo(f"kubelet sees {resource}: {listed}")

            kubelet = FakeKubelet(plugin_dir, on_list=show)
            kubelet.start()
            click.echo(f"fake kubelet serving {kubelet.socket_path}", err=True)
        source = (
            _SimSource(sim_spec, _driver_types(sim_spec))
            if sim_spec
            else _SysfsSource(sysfs_root or "/sys", _driver_types(None))
        )
        _publish(manager, source.scan())
        while not stop.wait(0.2 if sim_spec else resync):
            snapshot = source.changed()
            if snapshot is not None:
                _publish(manager, snapshot)
    except (VgpuStateError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    finally:
        manager.stop()
        if kubelet is not None:
            kubelet.stop()
        if source is not None:
            source.close()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _publish(manager: DevicePluginManager, snapshot: NodeSnapshot) -> None:
    manager.refresh(snapshot)
    status = manager.status()
    if not status:
        click.echo("no vGPUs to advertise", err=True)
    for problem in manager.problems:
        click.echo(f"problem: {problem}", err=True)


def _driver_types(sim_spec: str | None) -> DriverTypeMemory:
    """What the driver listed, read (never written) from the state directory's table:
    it names the vGPUs of a full GPU whose type the catalog lacks (docs/apply.md)."""
    from vgpu_state.catalog import default_catalog
    from vgpu_state.cli.session import driver_type_memory, state_dir
    from vgpu_state.reconcile import Settings

    path = state_dir(sim_spec).driver_types
    return driver_type_memory(Settings(default_catalog(), driver_types_path=path), record=False)


class _Source:
    scan: Callable[[], NodeSnapshot]

    def changed(self) -> NodeSnapshot | None:
        return self.scan()

    def close(self) -> None:
        pass


class _SysfsSource(_Source):
    def __init__(self, root: str, memory: DriverTypeMemory) -> None:
        from vgpu_state.catalog import default_catalog
        from vgpu_state.host import scan

        catalog = default_catalog()
        self.scan = lambda: memory.observe(scan(root, os.uname().nodename, catalog=catalog))


class _SimSource(_Source):
    """A simulated node rendered as a directory tree, rebuilt when its spec file changes."""

    def __init__(self, spec: str, memory: DriverTypeMemory) -> None:
        from vgpu_state.sim.host import SimHost

        self.spec = spec
        self.memory = memory
        self._make = SimHost
        self.host = SimHost(spec, driver_types=memory)
        self.mtime = os.stat(spec).st_mtime_ns
        self.scan = self._scan

    def _scan(self) -> NodeSnapshot:
        return self.host.scan()

    def changed(self) -> NodeSnapshot | None:
        mtime = os.stat(self.spec).st_mtime_ns
        if mtime == self.mtime:
            return None
        self.mtime = mtime
        old, self.host = self.host, self._make(self.spec, driver_types=self.memory)
        snapshot = self.host.scan()
        old.close()
        return snapshot

    def close(self) -> None:
        self.host.close()
