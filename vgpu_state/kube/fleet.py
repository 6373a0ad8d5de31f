"""Read what every node last reported, for a fleet-wide plan: list requests, no writes.

The ``VGPUNodeState`` objects are listed page by page (``limit``/``continue``,
as kubectl's ``--chunk-size``), the Nodes after the first page (only their
labels are kept). Each page's objects are decoded into :class:`ReportedNode`
values one at a time and handed on before the next page is requested, so a
fleet of any size is held one page of JSON and one node at a time. Each
node's status gives the scan its agent last made (``status.snapshot``) and the
vGPUs held then (``status.gpus[].vgpus[].holder``); the Node gives its labels
now. A node whose report cannot be planned against
is returned with the reason (:class:`~vgpu_state.model.fleet.Unknown`), never
raised.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from vgpu_state.kube import nodestate
from vgpu_state.kube.api import JsonObject, KubeApi, path_of
from vgpu_state.kube.errors import ClusterError, NotFoundError
from vgpu_state.kube.node import labels_of
from vgpu_state.kube.nodestate import (
    SnapshotDecodeError,
    SnapshotDecoder,
    VGPUNodeStateStatus,
    known_status,
    parse_time,
)
from vgpu_state.model.fleet import ReportedNode, Unknown, UnknownReason
from vgpu_state.model.snapshot import scan_problem

DEFAULT_CHUNK_SIZE = 500
"""Objects per list request (kubectl's default ``--chunk-size``)."""


def list_pages(
    api: KubeApi, path: str, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[list[JsonObject]]:
    """The collection at ``path``, a page of at most ``chunk_size`` objects per request
    (``0``: all in one request).

    Raises the API's errors; a continue token that expired while the list was
    read (HTTP 410) says so.
    """
    token = ""
    while True:
        query = {"limit": str(chunk_size)} if chunk_size > 0 else {}
        if token:
            query["continue"] = token
        try:
            body = api.request("GET", path, query=query or None)
        except ClusterError as e:
            if e.status == 410:
                raise ClusterError(
                    f"{e} (the list took longer than the API server keeps its snapshot; "
                    "run the command again, or with a larger --chunk-size)",
                    e.status,
                    e.api_reason,
                ) from None
            raise
        token = str((body.get("metadata") or {}).get("continue") or "")
        items = body.get("items") or []
        del body
        yield [i for i in items if isinstance(i, dict)]
        del items
        if not token or chunk_size <= 0:
            return


def read_labels(api: KubeApi, chunk_size: int = DEFAULT_CHUNK_SIZE) -> dict[str, dict[str, str]]:
    """Every Node's labels by name (the rest of each Node is dropped as it is read)."""
    labels: dict[str, dict[str, str]] = {}
    for page in list_pages(api, path_of("", "v1", "nodes"), chunk_size):
        for node in page:
            name = (node.get("metadata") or {}).get("name")
            if isinstance(name, str):
                labels[name] = labels_of(node)
    return labels


def fleet_pages(
    api: KubeApi, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> tuple[dict[str, dict[str, str]], Iterator[list[JsonObject]]]:
    """Every Node's labels, and the ``VGPUNodeState`` objects page by page (each page
    requested when the previous one is done with), in the order the API server lists
    them (by name, for a real one; callers that need an order sort).

    Raises :class:`~vgpu_state.kube.errors.ClusterError` when the resource is
    not installed, and the API's errors when the cluster cannot be read.
    """
    pages = list_pages(api, nodestate.object_path(), chunk_size)
    try:
        first = next(pages, [])
    except NotFoundError as e:
        raise NotFoundError(
            f"the cluster has no {nodestate.KIND} resource (is vgpu-state installed? "
            f"the CustomResourceDefinition is {nodestate.PLURAL}.{nodestate.GROUP}): {e}",
            e.status,
            e.api_reason,
        ) from None
    labels = read_labels(api, chunk_size)

    def every_page() -> Iterator[list[JsonObject]]:
        yield first
        yield from pages

    return labels, every_page()


def reported_nodes(
    page: list[JsonObject],
    labels: Mapping[str, Mapping[str, str]],
    decoder: SnapshotDecoder,
) -> Iterator[ReportedNode]:
    """Each ``VGPUNodeState`` of ``page`` as a :class:`ReportedNode`, one at a time."""
    for obj in page:
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            yield reported_node(name, obj, labels.get(name), decoder)


def stream_fleet(api: KubeApi, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[ReportedNode]:
    """Every node that has a ``VGPUNodeState``, one at a time (see :func:`fleet_pages`)."""
    labels, pages = fleet_pages(api, chunk_size)
    decoder = SnapshotDecoder()
    for page in pages:
        yield from reported_nodes(page, labels, decoder)


def read_fleet(api: KubeApi, chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[ReportedNode, ...]:
    """Every node that has a ``VGPUNodeState``, sorted by name, all at once (for small
    fleets and tests; ``fleet plan`` streams with :func:`fleet_pages`)."""
    found = {n.name: n for n in stream_fleet(api, chunk_size)}
    return tuple(found[name] for name in sorted(found))


def reported_node(
    name: str,
    obj: Mapping[str, Any],
    labels: Mapping[str, str] | None,
    decoder: SnapshotDecoder | None = None,
) -> ReportedNode:
    """One node from its ``VGPUNodeState`` object and its Node's labels (``None``: no Node).

    ``decoder`` shares what is identical across the nodes it decodes."""
    raw = obj.get("status")
    if not isinstance(raw, dict) or not raw:
        return _unknown(name, labels, UnknownReason.NO_STATUS, "the node has not reported yet")
    try:
        status = VGPUNodeStateStatus.model_validate(known_status(raw))
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
        snapshot = (decoder or SnapshotDecoder()).decode(status.snapshot)
    except SnapshotDecodeError as e:
        return _unknown(name, labels, UnknownReason.SNAPSHOT_UNREADABLE, str(e), **common)
    refused = scan_problem(name, snapshot)
    if refused is not None:
        return _unknown(name, labels, UnknownReason.SCAN_REFUSED, refused, **common)
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
