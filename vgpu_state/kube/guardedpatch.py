"""Guarded JSON Patches (RFC 6902): computed with ``jsonpatch``, checked locally, then sent.

Every JSON Patch vgpu-state sends goes through :func:`send`: the caller hands it the
object it read, the object it wants and the patch; the patch is applied to a copy of
the object read with ``jsonpatch`` and the write is refused (:class:`PatchCheckError`,
no request sent) unless the result is the object wanted. The patch itself is made by
:func:`guarded_patch`: the difference ``jsonpatch.make_patch`` computes, with ``test``
ops in front of it so that the API server applies it only to the object it was computed
from:

* every ``replace`` or ``remove`` is preceded by a ``test`` of the value read at its path
  (and a ``move`` by one of its source);
* the paths the caller names in ``guards`` are tested as read when they exist (e.g. an
  ownership annotation the patch leaves alone but whose value it was computed from);
* an ``add`` of a member the object read lacks cannot be guarded by a ``test`` of it (RFC
  6902 has no "absent" test, and ``add`` silently replaces a member another writer
  added meanwhile), so with ``guard_adds`` a patch holding one starts with a ``test`` of
  ``metadata.resourceVersion``.

``atomic`` names lists the API server treats as one value
(``x-kubernetes-list-type: atomic``). For them the patch carries the whole new list
(``test`` of the list read, then ``replace``) instead of the library's per-index ops
(``add``/``remove``/``move`` at positions that are right only for the list read): with
the ``test`` in front either form is safe, but the whole-list form says what the list
becomes without depending on positions, is what the API server's own list semantics
are, and keeps the library's list heuristics (which may emit ``move`` pairs) out of
lists other writers own entries in. Every other part of the difference is the
library's.

Pure except :func:`send`, which takes the API as an argument.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vgpu_state.kube.errors import ClusterError

if TYPE_CHECKING:
    from vgpu_state.kube.api import KubeApi

JsonObject = dict[str, Any]

RESOURCE_VERSION = "/metadata/resourceVersion"
_SHOWN = 400
"""Characters of a difference a :class:`PatchCheckError` shows."""


class PatchCheckError(ClusterError):
    """A JSON Patch that, applied to the object it was computed from, does not give the
    object wanted: a fault in vgpu-state. Nothing was sent."""


def pointer(*keys: str | int) -> str:
    """The JSON Pointer of ``keys`` (``~`` and ``/`` escaped as RFC 6901 says)."""
    return "".join("/" + str(k).replace("~", "~0").replace("/", "~1") for k in keys)


def _resolve(doc: Any, path: str) -> tuple[bool, Any]:
    """``(True, value)`` at ``path`` in ``doc``, or ``(False, None)`` when there is none."""
    import jsonpatch  # on the first patch: an agent that writes none never loads it

    try:
        return True, jsonpatch.JsonPointer(path).resolve(doc)
    except jsonpatch.JsonPointerException:
        return False, None


def test_op(path: str, value: Any) -> JsonObject:
    return {"op": "test", "path": path, "value": copy.deepcopy(value)}


def guarded_patch(
    read: Mapping[str, Any],
    wanted: Mapping[str, Any],
    *,
    atomic: Iterable[str] = (),
    guards: Iterable[str] = (),
    guard_adds: bool = True,
) -> list[JsonObject]:
    """The JSON Patch from ``read`` to ``wanted``, guarded (see the module); ``[]`` when
    they are equal. ``atomic``, ``guards``: JSON Pointers."""
    if read == wanted:
        return []
    import jsonpatch

    base: Any = copy.deepcopy(dict(read))
    changes: list[JsonObject] = []
    for path in atomic:
        had, old = _resolve(base, path)
        has, new = _resolve(wanted, path)
        if had and has and old != new:
            changes.append({"op": "replace", "path": path, "value": copy.deepcopy(new)})
            jsonpatch.JsonPointer(path).set(base, copy.deepcopy(new))
    changes.extend(jsonpatch.make_patch(base, dict(wanted)).patch)
    tested: set[str] = set()
    ops: list[JsonObject] = []

    def guard(path: str) -> None:
        found, value = _resolve(read, path)
        if found and path not in tested:
            tested.add(path)
            ops.append(test_op(path, value))

    for path in guards:
        guard(path)
    adds = False
    for op in changes:
        kind = op["op"]
        if kind in ("replace", "remove"):
            guard(op["path"])
        elif kind == "move":
            guard(op["from"])
        if kind in ("add", "move", "copy"):
            adds = True
        ops.append(op)
    if adds and guard_adds:
        found, rv = _resolve(read, RESOURCE_VERSION)
        if found and RESOURCE_VERSION not in tested:
            ops.insert(0, test_op(RESOURCE_VERSION, rv))
    return ops


def check(
    read: Mapping[str, Any],
    patch: Sequence[Mapping[str, Any]],
    wanted: Mapping[str, Any],
    what: str,
) -> None:
    """Apply ``patch`` to a copy of ``read``; :class:`PatchCheckError` naming ``what`` and the
    difference unless that gives ``wanted`` (or a ``test`` op of it fails on ``read``)."""
    import jsonpatch

    try:
        result = jsonpatch.apply_patch(copy.deepcopy(dict(read)), [dict(op) for op in patch])
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise PatchCheckError(
            f"{what}: the JSON Patch computed from the object read does not apply to it "
            f"({e}); nothing was sent"
        ) from e
    if result != wanted:
        diff = json.dumps(jsonpatch.make_patch(result, dict(wanted)).patch, sort_keys=True)
        if len(diff) > _SHOWN:
            diff = diff[:_SHOWN] + "..."
        raise PatchCheckError(
            f"{what}: the JSON Patch, applied to the object read, does not give the object "
            f"wanted (still to do: {diff}); nothing was sent"
        )


def send(
    api: KubeApi,
    path: str,
    read: Mapping[str, Any],
    patch: Sequence[Mapping[str, Any]],
    wanted: Mapping[str, Any],
    what: str,
) -> JsonObject:
    """:func:`check` the patch, then send it to ``path``: the one way vgpu-state sends a JSON
    Patch. ``what`` names the object in errors (``KubeVirt CR kubevirt/kubevirt``)."""
    check(read, patch, wanted, what)
    return api.patch(path, [dict(op) for op in patch], "json")
