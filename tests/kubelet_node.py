"""The kubelet's other half for the tests: it writes the Node's status from the device lists.

A real kubelet's device manager counts, per extended resource, every device a
plugin lists (``status.capacity``) and the healthy ones
(``status.allocatable``), and the kubelet posts them in the Node's status; the
scheduler places pods by ``allocatable``. :class:`KubeletNodeStatus` does that
for a :class:`~vgpu_state.testing.deviceplugin_kubelet.DevicePluginKubelet`, beside the
node's own resources (cpu, memory, and another plugin's ``nvidia.com/gpu``,
which vgpu-state must leave alone). It can also lose a resource's registration
(:meth:`lose`: the kubelet drops the plugin and shows 0 allocatable, the plugin
is not told) and post a heartbeat (:meth:`heartbeat`: a status update that
changes no resource).

On the real control plane (:class:`tests.realcluster.ControlPlane`) every post
is a merge patch of the Node's ``status`` subresource by the cluster's admin,
standing in for the kubelet's own identity; on the API server emulator
(``tests/kube_emulator.py``, which ``scripts/demo_agent.py`` uses) it is a merge
into the stored Node.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any, Protocol

from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet, SeenDevice


class Cluster(Protocol):
    """The test emulator or the real control plane (``tests/realcluster.py``)."""

    def write(
        self, kind: str, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> Any:
        """Create or merge into an object (its ``status`` included); the real server's
        answer is the object as stored, the emulator's ``None``."""

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or ``None``."""


NODE_RESOURCES = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"}


class KubeletNodeStatus:
    """Installs itself as ``kubelet.on_list``; every list the kubelet gets is posted."""

    def __init__(self, kube: Cluster, node: str, kubelet: DevicePluginKubelet) -> None:
        self.kube = kube
        self.node = node
        self.kubelet = kubelet
        self._lock = threading.Lock()
        self.capacity: dict[str, int] = {}
        self.allocatable: dict[str, int] = {}
        self.heartbeats = 0
        kubelet.on_list = self._listed

    def _listed(self, resource: str, devices: tuple[SeenDevice, ...]) -> None:
        with self._lock:
            self.capacity[resource] = len(devices)
            self.allocatable[resource] = sum(d.health == "Healthy" for d in devices)
            self._post()

    def lose(self, resource: str) -> None:
        """The kubelet loses the plugin of ``resource``: allocatable 0, capacity kept."""
        with self._lock:
            self.kubelet.forget(resource)
            self.allocatable[resource] = 0
            self._post()

    def heartbeat(self) -> str:
        """A node-status update that changes no resource; returns the Node's new version."""
        with self._lock:
            self.heartbeats += 1
            now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            written = self.kube.write(
                "v1/nodes",
                self.node,
                {
                    "status": {
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "KubeletReady",
                                "lastHeartbeatTime": now,
                                "message": f"heartbeat {self.heartbeats}",
                            }
                        ]
                    }
                },
            )
        # The real server answers with the Node as written (the agent may write it next);
        # the emulator answers nothing, so its Node is read back.
        found = written if isinstance(written, dict) else self.kube.get("v1/nodes", self.node)
        assert found is not None
        return str(found["metadata"]["resourceVersion"])

    def _post(self) -> None:
        status: dict[str, Any] = {
            "capacity": {**NODE_RESOURCES, **{r: str(n) for r, n in self.capacity.items()}},
            "allocatable": {**NODE_RESOURCES, **{r: str(n) for r, n in self.allocatable.items()}},
        }
        self.kube.write("v1/nodes", self.node, {"status": status})
