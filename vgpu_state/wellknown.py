"""Every default path and port vgpu-state uses on a node, defined once.

Flags and settings override each of them; no other module spells them
(``tests/test_one_definition.py`` greps the package for the literals). The
kubelet's paths are the kubelet's own defaults (``--root-dir=/var/lib/kubelet``);
the CDI directory is the one container runtimes read.
"""

from __future__ import annotations

STATE_DIR = "/var/lib/vgpu-state"
"""A node's state directory: the journal, the host lock, the driver's type lists and
the vGPUs the agent withholds (the agent's ``--state-dir``; ``vgpu-state apply`` on the
node uses the same files)."""
JOURNAL_FILE = "journal.jsonl"
"""The apply journal's name in a state directory."""
LOCK_FILE = "apply.lock"
"""The host lock's name in a state directory."""
DRIVER_TYPES_FILE = "driver-types.json"
"""The name, in a state directory, of the vGPU types the driver listed."""
WITHHELD_FILE = "withheld.json"
"""The name, in a state directory, of the free vGPUs the agent withholds while a layout
switch is pending (``in-use: evacuate``), which ``vgpu-state scan`` reads."""

SYSFS_ROOT = "/sys"
"""Where sysfs is mounted (``--sysfs-root``; the DaemonSet mounts the host's)."""
PROC_ROOT = "/proc"
"""Where the processes holding vGPUs are read (``--proc-root``)."""
SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"
"""Where NVIDIA's vGPU Manager installs its SR-IOV helper (used when installed)."""
NVIDIA_SMI = "/usr/bin/nvidia-smi"
"""Where NVIDIA's driver installs nvidia-smi (MIG and mixed-size mode; used when installed)."""

METRICS_PORT = 9410
"""The port of ``/metrics`` and the health endpoints (agent and cluster controller)."""
METRICS_LISTEN = f":{METRICS_PORT}"
"""The default ``--listen`` address of the agent and the cluster controller."""

KUBELET_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
"""Where the kubelet's device manager serves its socket and plugins put theirs."""
KUBELET_DEVICE_PLUGIN_SOCKET = "kubelet.sock"
"""The name of the kubelet's Registration socket in the device-plugins directory."""
KUBELET_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""The kubelet's pod-resources API (which pod holds which device)."""
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
"""Where a DRA driver keeps its socket and files (``<dir>/<driver>/``)."""
KUBELET_PLUGIN_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
"""Where the kubelet's plugin watcher finds registration sockets."""
CDI_DIR = "/var/run/cdi"
"""Where container runtimes read CDI specs."""
