"""The ports: the only ways a reconcile reaches the world.

* :class:`HostPort` — read and change one node's vGPUs (sysfs, or the simulator).
* :class:`ClusterPort` — the node's identity and labels, which vGPUs pods and VMs
  hold, and where status and Events go (Kubernetes, or :class:`MemoryCluster`).
* :class:`ConfigSource` — the config document, keeping the last good one.
* :class:`DevicePluginSink` — what learns the node's vGPUs after each apply.
* :class:`ProcessHolders` — which vGPUs the node's processes hold open (``/proc``).
* :class:`ClusterPlanner` — the cluster's part of a plan and its blockers (the KubeVirt CR).
* :class:`WithheldSink` — where an agent records the vGPUs it withholds (for ``scan``).

Each is a ``Protocol``: an implementation needs no import from here.
``vgpu_state.testing`` has recording fakes of each for tests.
"""

from vgpu_state.ports.cluster import ClusterPort, MemoryCluster
from vgpu_state.ports.clusterplan import ClusterPlanner, NoClusterPlan
from vgpu_state.ports.config import ConfigSource
from vgpu_state.ports.deviceplugin import DevicePluginSink, NoDevicePlugin
from vgpu_state.ports.host import HostPort
from vgpu_state.ports.processes import NoProcesses, ProcessHolders
from vgpu_state.ports.withheld import NoWithheldRecord, WithheldSink

__all__ = [
    "ClusterPlanner",
    "ClusterPort",
    "ConfigSource",
    "DevicePluginSink",
    "HostPort",
    "MemoryCluster",
    "NoClusterPlan",
    "NoDevicePlugin",
    "NoProcesses",
    "NoWithheldRecord",
    "ProcessHolders",
    "WithheldSink",
]
