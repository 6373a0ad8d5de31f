"""Events on the Node, aggregated: one Event per node and reason, its count bumped on repeats.

``kubectl describe node`` lists them. A node that flaps (apply fails, succeeds,
fails) does not flood the namespace with Events: each (node, reason) pair has
one Event with a deterministic name, and a repeat raises its ``count`` and
``lastTimestamp`` and takes the newest message, as the kubelet's own event
correlator does. The name survives restarts, so aggregation does too.
"""

from __future__ import annotations

import datetime
import hashlib
import re

from vgpu_state.kube.api import ConflictError, JsonObject, KubeApi, path_of, retry_on_conflict
from vgpu_state.kube.errors import ContendedWriteError, NotFoundError
from vgpu_state.model.status import EventType
from vgpu_state.model.timestamps import rfc3339

COMPONENT = "vgpu-state"
EVENT_NAMESPACE = "default"
"""Events about a Node (cluster-scoped) live in ``default``, as the kubelet's do."""


_NAME_UNSAFE = re.compile(r"[^a-z0-9.-]+")


def event_name(node: str, reason: str) -> str:
    """``<node>.vgpu-state.<reason>``: a valid object name, the same for every repeat."""
    name = _NAME_UNSAFE.sub("-", f"{node}.{COMPONENT}.{reason}".lower()).strip("-.")
    if len(name) > 253:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[:242]}.{digest}"
    return name


def record(
    api: KubeApi,
    node: str,
    reason: str,
    message: str,
    type: EventType = EventType.NORMAL,
    *,
    node_uid: str | None = None,
    instance: str | None = None,
    namespace: str = EVENT_NAMESPACE,
    now: datetime.datetime | None = None,
    involved: JsonObject | None = None,
    component: str = COMPONENT,
) -> JsonObject:
    """Create the node's Event for ``reason``, or bump the count of the existing one.

    ``involved``: the object the Event is about when it is not the Node (the node's
    ``VGPUNodeState``); ``component``: who reports it (the controller names itself).
    """
    moment = now or datetime.datetime.now(tz=datetime.UTC)
    name = event_name(node, reason)
    path = path_of("", "v1", "events", name, namespace)

    def attempt() -> JsonObject:
        try:
            existing = api.get(path)
        except NotFoundError:
            existing = None
        if existing is None:
            about: JsonObject = dict(involved or {"apiVersion": "v1", "kind": "Node", "name": node})
            if node_uid and involved is None:
                about["uid"] = node_uid
            body: JsonObject = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": about,
                "reason": reason,
                "message": message,
                "type": type.value,
                "count": 1,
                "firstTimestamp": rfc3339(moment),
                "lastTimestamp": rfc3339(moment),
                "source": {"component": component, "host": node},
                "reportingComponent": component,
                "reportingInstance": instance or node,
            }
            return api.create(path_of("", "v1", "events", None, namespace), body)
        count = int(existing.get("count") or 1) + 1
        patch: JsonObject = {
            "metadata": {
                "resourceVersion": (existing.get("metadata") or {}).get("resourceVersion")
            },
            "count": count,
            "lastTimestamp": rfc3339(moment),
            "message": message,
            "type": type.value,
        }
        try:
            return api.patch(path, patch, "merge")
        except NotFoundError as e:  # expired (Events have a TTL) between the read and the write
            raise ConflictError(str(e), e.status, e.api_reason) from e

    return retry_on_conflict(
        attempt, 8, ContendedWriteError(f"Event {namespace}/{name} kept changing; not recorded")
    )
