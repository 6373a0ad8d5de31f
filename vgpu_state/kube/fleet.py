"""Read what every node last reported, for a fleet-wide plan: two list requests, no writes.

One list of ``VGPUNodeState`` objects and one of Nodes, joined by name. Each
node's status gives the scan its agent last made (``status.snapshot``) and the
vGPUs held then (``status.gpus[].vgpus[].holder``); the Node gives its labels
now. A node whose report cannot be planned against is returned with the
reason (:class:`~vgpu_state.model.fleet.Unknown`), never raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from vgpu_state.kube import nodestate
from vgpu_state.kube.api import KubeApi, path_of
from vgpu_state.kube.errors import NotFoundError
from vgpu_state.kube.node import labels_of
from vgpu_state.kube.nodestate import (
    SnapshotDecodeError,
    VGPUNodeStateStatus,
    decode_snapshot,
    parse_time,
)
from vgpu_state.model.fleet import ReportedNode, Unknown, UnknownReason


def read_fleet(api: KubeApi) -> tuple[ReportedNode, ...]:
    """Every node that has a ``VGPUNodeState``, sorted by name.

    Raises :class:`~vgpu_state.kube.errors.ClusterError` when the resource is
    not installed, and the API's errors when the cluster cannot be read.
    """
    try:
        states = nodestate.list_all(api)
    except NotFoundError as e:
        raise NotFoundError(
            f"the cluster has no {nodestate.KIND} resource (is vgpu-state installed? "
            f"the CustomResourceDefinition is {nodestate.PLURAL}.{nodestate.GROUP}): {e}",
            e.status,
            e.api_reason,
        ) from None
    labels: dict[str, dict[str, str]] = {}
    for node in api.list(path_of("", "v1", "nodes")):
        name = (node.get("metadata") or {}).get("name")
        if isinstance(name, str):
            labels[name] = labels_of(node)
    found: dict[str, ReportedNode] = {}
    for obj in states:
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            found[name] = reported_node(name, obj, labels.get(name))
    return tuple(found[name] for name in sorted(found))


def reported_node(
    name: str, obj: Mapping[str, Any], labels: Mapping[str, str] | None
) -> ReportedNode:
    """One node from its ``VGPUNodeState`` object and its Node's labels (``None``: no Node)."""
    raw = obj.get("status")
    if not isinstance(raw, dict) or not raw:
        return _unknown(name, labels, UnknownReason.NO_STATUS, "the node has not reported yet")
    try:
        status = VGPUNodeStateStatus.model_validate(raw)
    except ValidationError as e:
        problem = e.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        return _unknown(
            name,
            labels,
            UnknownReason.STATUS_UNREADABLE,
            f"status.{where}: {problem['msg']}" if where else f"status: {problem['msg']}",
        )
    common: dict[str, Any] = {
        "reported_config": status.selected_config.name if status.selected_config else None,
        "reported_state": status.state.value if status.state else None,
    }
    if status.snapshot is None:
        return _unknown(
            name,
            labels,
            UnknownReason.NO_SNAPSHOT,
            "the status carries no scan of the host (the node's agent is older than "
            "this command, or has not scanned yet)",
            **common,
        )
    scanned_at = parse_time(status.snapshot.scanned_at)
    if scanned_at is None:
        return _unknown(
            name,
            labels,
            UnknownReason.SNAPSHOT_UNREADABLE,
            f"status.snapshot.scannedAt {status.snapshot.scanned_at!r} is not a time",
            **common,
        )
    try:
        snapshot = decode_snapshot(status.snapshot)
    except SnapshotDecodeError as e:
        return _unknown(name, labels, UnknownReason.SNAPSHOT_UNREADABLE, str(e), **common)
    if labels is None:
        return _unknown(
            name,
            None,
            UnknownReason.NODE_MISSING,
            f"Node {name} does not exist (its {nodestate.KIND} is left over)",
            **common,
        )
    held = {v.id: v.holder for g in status.gpus for v in g.vgpus if v.holder}
    return ReportedNode(
        name=name,
        labels=labels,
        snapshot=snapshot,
        in_use=held,
        in_use_known=status.in_use_known,
        scanned_at=scanned_at,
        **common,
    )


def _unknown(
    name: str,
    labels: Mapping[str, str] | None,
    reason: UnknownReason,
    message: str,
    **common: Any,
) -> ReportedNode:
    return ReportedNode(name=name, labels=labels, unknown=Unknown(reason, message), **common)
