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

import functools
import json
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, overload

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_core import from_json

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
from vgpu_state.model import bounded
from vgpu_state.model.fleet import ReportedNode, Unknown, UnknownReason
from vgpu_state.model.frozen import Tolerant
from vgpu_state.model.snapshot import scan_problem

DEFAULT_CHUNK_SIZE = 500
"""Objects per list request (kubectl's default ``--chunk-size``)."""

METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
"""``Accept`` for a list of the objects' metadata only (what ``kubectl get`` asks for when
it needs no more): the API server leaves out each Node's spec and status. A server that
cannot answer so sends the whole objects (the second choice)."""

Page = list[JsonObject] | bytes
"""A page of a list: its objects, or the response's JSON text not yet decoded
(:func:`page_items` decodes either)."""


def list_pages(
    api: KubeApi, path: str, chunk_size: int = DEFAULT_CHUNK_SIZE, accept: str | None = None
) -> Iterator[list[JsonObject]]:
    """The collection at ``path``, a page of at most ``chunk_size`` objects per request
    (``0``: all in one request).

    Raises the API's errors; a continue token that expired while the list was
    read (HTTP 410) says so.
    """
    for raw in list_raw_pages(api, path, chunk_size, accept):
        yield page_items(raw)


def list_raw_pages(
    api: KubeApi, path: str, chunk_size: int = DEFAULT_CHUNK_SIZE, accept: str | None = None
) -> Iterator[bytes]:
    """As :func:`list_pages`, each page the response's JSON text: only the list's
    ``metadata`` (its continue token) is decoded here, so that the items can be decoded
    where they are used (another process)."""
    token = ""
    while True:
        query = {"limit": str(chunk_size)} if chunk_size > 0 else {}
        if token:
            query["continue"] = token
        try:
            raw = api.get_bytes(path, query=query or None, accept=accept or "application/json")
        except ClusterError as e:
            if e.status == 410:
                raise ClusterError(
                    f"{e} (the list took longer than the API server keeps its snapshot; "
                    "run the command again, or with a larger --chunk-size)",
                    e.status,
                    e.api_reason,
                ) from None
            raise
        token = continue_token(raw)
        yield raw
        del raw
        if not token or chunk_size <= 0:
            return


def page_items(page: Page) -> list[JsonObject]:
    """The objects of a page (see :data:`Page`); a body that is not a list has none."""
    if not isinstance(page, bytes):
        return page
    body = _decode_list(page)
    items = body.get("items") or []
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


_JSON = json.JSONDecoder()
_BLANK = " \t\n\r"
_HEAD = 64 * 1024
"""How much of a list response is searched for its ``metadata`` before the items."""


def continue_token(raw: bytes) -> str:
    """``metadata.continue`` of a list response (JSON text), decoding only the fields
    before ``items`` (the API server writes ``kind``, ``apiVersion``, ``metadata``,
    then ``items``); the whole text when they are in another order."""
    try:
        metadata = _metadata_before_items(raw[:_HEAD].decode("utf-8", "replace"))
    except (ValueError, IndexError):
        metadata = None
    if metadata is None:
        metadata = _decode_list(raw).get("metadata")
    if not isinstance(metadata, dict):
        return ""
    return str(metadata.get("continue") or "")


def _metadata_before_items(text: str) -> Any:
    """The top-level ``metadata`` of the JSON object ``text`` begins, read field by field
    up to it; ``None`` when ``items`` comes first. Raises ``ValueError`` or ``IndexError``
    when the text is cut off before it, or is not an object."""

    def blank(at: int) -> int:
        while text[at] in _BLANK:
            at += 1
        return at

    at = blank(0)
    if text[at] != "{":
        raise ValueError("not an object")
    at = blank(at + 1)
    while text[at] != "}":
        key, at = _JSON.raw_decode(text, at)
        at = blank(at)
        if not isinstance(key, str) or text[at] != ":":
            raise ValueError("not an object")
        if key == "items":
            return None
        value, at = _JSON.raw_decode(text, blank(at + 1))
        if key == "metadata":
            return value
        at = blank(at)
        if text[at] == ",":
            at = blank(at + 1)
        elif text[at] != "}":
            raise ValueError("not an object")
    return {}


def _decode_list(raw: bytes) -> dict[str, Any]:
    try:
        # pydantic's JSON parser, about twice as fast as the standard one; what it refuses
        # that the standard one may read (lone surrogates, a byte order mark, very deep
        # nesting), and text that is not JSON, is read by the standard one, as before.
        body = from_json(raw, cache_strings="keys")
    except ValueError:
        try:
            body = bounded.loads(raw, "the list")
        except bounded.InputShapeError as e:
            raise ClusterError(f"the API server sent a list that cannot be read: {e}") from None
        except ValueError as e:
            raise ClusterError(f"the API server sent a list that is not JSON: {e}") from None
    return body if isinstance(body, dict) else {}


def read_labels(api: KubeApi, chunk_size: int = DEFAULT_CHUNK_SIZE) -> dict[str, dict[str, str]]:
    """Every Node's labels by name (the Nodes' metadata only is asked for; the rest of
    each Node is dropped as it is read)."""
    labels: dict[str, dict[str, str]] = {}
    for page in list_pages(api, path_of("", "v1", "nodes"), chunk_size, METADATA_ONLY):
        for node in page:
            name = (node.get("metadata") or {}).get("name")
            if isinstance(name, str):
                labels[name] = labels_of(node)
    return labels


@overload
def fleet_pages(
    api: KubeApi, chunk_size: int = ..., *, raw: Literal[False] = ...
) -> tuple[dict[str, dict[str, str]], Iterator[list[JsonObject]]]: ...


@overload
def fleet_pages(
    api: KubeApi, chunk_size: int = ..., *, raw: Literal[True]
) -> tuple[dict[str, dict[str, str]], Iterator[bytes]]: ...


def fleet_pages(
    api: KubeApi, chunk_size: int = DEFAULT_CHUNK_SIZE, *, raw: bool = False
) -> tuple[dict[str, dict[str, str]], Iterator[list[JsonObject]] | Iterator[bytes]]:
    """Every Node's labels, and the ``VGPUNodeState`` objects page by page (each page
    requested when the previous one is done with), in the order the API server lists
    them (by name, for a real one; callers that need an order sort). ``raw``: each page
    as the response's JSON text, for :func:`page_items` to decode where it is used.

    Raises :class:`~vgpu_state.kube.errors.ClusterError` when the resource is
    not installed, and the API's errors when the cluster cannot be read.
    """
    pages: Iterator[Any]
    if raw:
        pages = list_raw_pages(api, nodestate.object_path(), chunk_size)
    else:
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

    def every_page() -> Iterator[Any]:
        yield first
        yield from pages

    return labels, every_page()


def reported_nodes(
    page: Page,
    labels: Mapping[str, Mapping[str, str]],
    decoder: SnapshotDecoder,
) -> Iterator[ReportedNode]:
    """Each ``VGPUNodeState`` of ``page`` as a :class:`ReportedNode`, one at a time."""
    checked = _checked_page(page) if isinstance(page, bytes) else None
    if checked is not None:
        for item in checked:
            name = item.metadata.name
            if isinstance(name, str) and name:
                yield _reported(name, item.status, labels.get(name), decoder)
        return
    for obj in page_items(page):
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            yield reported_node(name, obj, labels.get(name), decoder)


class _Metadata(Tolerant):
    name: Any = None


class _Item(Tolerant):
    """A ``VGPUNodeState`` of a list: its name, and its status validated as
    :func:`_status` first validates it (else as it is, for :func:`reported_node`)."""

    metadata: _Metadata = _Metadata()
    status: Annotated[VGPUNodeStateStatus | Any, Field(union_mode="left_to_right")] = None


class _List(Tolerant):
    items: list[_Item] | None = None


@functools.cache
def _list_adapter() -> TypeAdapter[_List]:
    return TypeAdapter(_List)


def _checked_page(raw: bytes) -> list[_Item] | None:
    """The items of a list response, each status validated straight from the text (no
    decoded JSON built and then validated); ``None`` when the page does not read so
    (not JSON, an item or metadata that is not an object, …): it is then read as
    :func:`page_items` reads it, with the same result."""
    try:
        return _list_adapter().validate_json(raw).items or []
    except ValueError:
        return None


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
    return _reported(name, obj.get("status"), labels, decoder)


def _reported(
    name: str,
    raw: Any,
    labels: Mapping[str, str] | None,
    decoder: SnapshotDecoder | None,
) -> ReportedNode:
    """:func:`reported_node` of the status ``raw``: as the object holds it, or already
    validated (a status of no field is one that is empty)."""
    if isinstance(raw, VGPUNodeStateStatus):
        if not raw.model_fields_set:
            return _unknown(name, labels, UnknownReason.NO_STATUS, "the node has not reported yet")
        status = raw
    elif not isinstance(raw, dict) or not raw:
        return _unknown(name, labels, UnknownReason.NO_STATUS, "the node has not reported yet")
    else:
        try:
            status = _status(raw)
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


def _status(raw: dict[str, Any]) -> VGPUNodeStateStatus:
    """``raw`` as this version reads it: validated as it is first (what an agent of this
    version writes), and only when that fails without the fields and condition types
    this version does not know (:func:`~vgpu_state.kube.nodestate.known_status`), whose
    error is the one reported. A status that validates as it is has none of those (the
    models forbid unknown fields and condition types): both give the same status."""
    try:
        return VGPUNodeStateStatus.model_validate(raw)
    except ValidationError:
        return VGPUNodeStateStatus.model_validate(known_status(raw))


def _unknown(
    name: str,
    labels: Mapping[str, str] | None,
    reason: UnknownReason,
    message: str,
    **common: Any,
) -> ReportedNode:
    return ReportedNode(name=name, labels=labels, unknown=Unknown(reason, message), **common)
