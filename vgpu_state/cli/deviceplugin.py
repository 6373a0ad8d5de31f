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
from types import FrameType
from typing import TYPE_CHECKING

import click

from vgpu_state.cli.errors import report
from vgpu_state.cli.options import (
    DEFAULT_SYSFS_ROOT,
    ENV_LOG_LEVEL,
    device_plugin_dir_option,
    seconds_option,
    sim_option,
    state_dir_option,
    sysfs_root_option,
)
from vgpu_state.model.errors import VgpuStateError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.wellknown import KUBELET_DEVICE_PLUGIN_DIR

if TYPE_CHECKING:
    from vgpu_state.compose import OpenNode
    from vgpu_state.deviceplugin import DevicePluginManager
    from vgpu_state.statefiles import DriverTypeMemory

DEFAULT_PLUGIN_DIR = KUBELET_DEVICE_PLUGIN_DIR


@click.command("deviceplugin")
@sim_option(
    "Advertise a simulated node; re-read when the spec file changes "
    "(vgpu-state apply --sim writes it)."
)
@sysfs_root_option(help="Advertise the vGPUs under this sysfs root (or --sim: a simulated node).")
@device_plugin_dir_option(" (with --fake-kubelet and not given: a temporary one)")
@state_dir_option()
@click.option(
    "--domain",
    default="nvidia.com",
    show_default=True,
    help="Resource name prefix: <domain>/<type name>.",
)
@seconds_option("--resync", 30.0, "Seconds between re-scans of --sysfs-root.", minimum=0.05)
@seconds_option(
    "--health-interval",
    2.0,
    "Seconds between checks that each device is still there.",
    minimum=0.05,
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
    device_plugin_dir: str,
    state_dir: str | None,
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
        report("UsageError", "usage", "give either --sim SPEC or --sysfs-root DIR, not both")
    if sim_spec is not None and not os.path.isfile(sim_spec):
        report("InputInvalid", "user", f"--sim {sim_spec}: no such file")
    if sim_spec is None:
        sysfs_root = sysfs_root or DEFAULT_SYSFS_ROOT
        if not os.path.isdir(sysfs_root):
            report("HostUnreadable", "host", f"--sysfs-root {sysfs_root}: no such directory")
    level = os.environ.get(ENV_LOG_LEVEL, "info").upper()
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    from vgpu_state.deviceplugin import DevicePluginManager

    temp_dir = None
    plugin_dir = device_plugin_dir
    given = click.get_current_context().get_parameter_source("device_plugin_dir")
    if fake_kubelet and given is click.core.ParameterSource.DEFAULT:
        temp_dir = plugin_dir = tempfile.mkdtemp(prefix="vgpu-dp-", dir="/tmp")
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
            from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet, SeenDevice

            def show(resource: str, devices: tuple[SeenDevice, ...]) -> None:
                listed = ", ".join(f"{d.id} ({d.health})" for d in devices) or "no devices"
                click.echo(f"kubelet sees {resource}: {listed}")

            kubelet = DevicePluginKubelet(plugin_dir, on_list=show)
            kubelet.start()
            click.echo(f"fake kubelet serving {kubelet.socket_path}", err=True)
        source = _Source(sim_spec, sysfs_root, state_dir)
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


class _Source:
    """The node the plugin advertises. What the driver listed is read (never written)
    from the state directory's table: it names the vGPUs of a full GPU whose type the
    catalog lacks (docs/apply.md). A simulated node is rendered as a directory tree,
    opened again when its spec file changes."""

    def __init__(
        self, sim_spec: str | None, sysfs_root: str | None, state_dir: str | None = None
    ) -> None:
        from vgpu_state.catalog import default_catalog
        from vgpu_state.cli.session import state_dir as session_state_dir
        from vgpu_state.compose import NodeSettings

        self.settings = NodeSettings(
            default_catalog(),
            sim_spec=sim_spec,
            sysfs_root=sysfs_root,
            driver_types=session_state_dir(sim_spec, directory=state_dir).driver_types,
            in_memory=False,
        )
        self.node = self._open(None)
        self.mtime = os.stat(sim_spec).st_mtime_ns if sim_spec else None

    def _open(self, memory: DriverTypeMemory | None) -> OpenNode:
        from vgpu_state.cli.session import warn
        from vgpu_state.compose import open_node

        return open_node(self.settings, warn, driver_types=memory)

    def scan(self) -> NodeSnapshot:
        return self.node.host.scan()

    def changed(self) -> NodeSnapshot | None:
        """A fresh scan; for a simulated node, only once its spec file changed."""
        if self.settings.sim_spec is None:
            return self.scan()
        mtime = os.stat(self.settings.sim_spec).st_mtime_ns
        if mtime == self.mtime:
            return None
        self.mtime = mtime
        old, self.node = self.node, self._open(self.node.driver_types)
        snapshot = self.node.host.scan()
        old.close()
        return snapshot

    def close(self) -> None:
        self.node.close()
