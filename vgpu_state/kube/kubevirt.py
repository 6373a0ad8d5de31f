"""The KubeVirt CR, read and written: find it, read it, and apply one guarded change.

The values (entries, blockers, the JSON Patch of a change) are computed in
:mod:`vgpu_state.kube.permitted`; this module only talks to the API server. The
cluster controller is the CR's only vgpu-state writer (:func:`write`); agents
and the CLI only read it, for the plan's cluster part and KubeVirt's blockers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_state.background import Backoff
from vgpu_state.kube import guardedpatch
from vgpu_state.kube.api import ConflictError, InvalidError, JsonObject, KubeApi, path_of
from vgpu_state.kube.errors import ClusterError, ContendedWriteError, NotFoundError
from vgpu_state.kube.permitted import (
    DISABLE_MDEV_GATE,
    LISTS,
    OWNERSHIP_ANNOTATION,
    Blocker,
    Desired,
    EntryChange,
    KubeVirtPlan,
    ListName,
    PermittedEntry,
    blockers,
    desired_entries,
    managed_resources,
    permitted,
    plan_write,
)

__all__ = [
    "DISABLE_MDEV_GATE",
    "LISTS",
    "OWNERSHIP_ANNOTATION",
    "WRITE_BACKOFF",
    "Blocker",
    "Desired",
    "EntryChange",
    "KubeVirtPlan",
    "KubeVirtRef",
    "ListName",
    "PermittedEntry",
    "WriteResult",
    "blockers",
    "desired_entries",
    "find",
    "managed_resources",
    "permitted",
    "plan_write",
    "read",
    "write",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class KubeVirtRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> KubeVirtRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"{text!r}: expected NAMESPACE/NAME of the KubeVirt CR")
        return cls(namespace, name)

    @property
    def path(self) -> str:
        return path_of("kubevirt.io", "v1", "kubevirts", self.name, self.namespace)


def _get(obj: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = obj
    for key in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


# the write ----------------------------------------------------------------------------
def find(api: KubeApi, ref: KubeVirtRef | None) -> KubeVirtRef:
    """``ref``, or the one KubeVirt CR in the cluster."""
    if ref is not None:
        return ref
    try:
        items = api.list(path_of("kubevirt.io", "v1", "kubevirts"))
    except NotFoundError as e:
        raise ClusterError(
            "KubeVirt is not installed: the API server serves no kubevirt.io/v1 KubeVirt resource"
        ) from e
    refs = sorted(
        KubeVirtRef(str(_get(i, "metadata", "namespace")), str(_get(i, "metadata", "name")))
        for i in items
    )
    if not refs:
        raise ClusterError("no KubeVirt CR found in the cluster (is KubeVirt deployed?)")
    if len(refs) > 1:
        raise ClusterError(
            f"{len(refs)} KubeVirt CRs found ({', '.join(map(str, refs))}); name the one to "
            "manage as NAMESPACE/NAME"
        )
    return refs[0]


def read(api: KubeApi, ref: KubeVirtRef) -> JsonObject:
    try:
        return api.get(ref.path)
    except NotFoundError as e:
        raise ClusterError(f"KubeVirt CR {ref} not found") from e


WRITE_BACKOFF = Backoff(0.05, 2.0)
"""The wait before the guarded write is tried again after a lost race (jittered)."""
WRITE_ATTEMPTS = 8
"""Lost races in a row before :func:`write` gives up until the next pass."""


@dataclass
class WriteResult:
    ref: KubeVirtRef
    changes: tuple[EntryChange, ...] = ()
    """What the accepted write changed (empty when the CR needed nothing)."""
    foreign: tuple[str, ...] = ()
    attempts: int = 0
    conflicts: int = 0
    writes: int = 0
    """Accepted writes: 1 when something changed, else 0."""


def write(
    api: KubeApi,
    ref: KubeVirtRef,
    compute: Callable[[JsonObject], KubeVirtPlan],
    *,
    backoff: Backoff = WRITE_BACKOFF,
    attempts: int = WRITE_ATTEMPTS,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> WriteResult:
    """Read the CR, ``compute`` the change from that read, send its one guarded patch.

    The patch is checked first: applied to the CR read, it must give the CR the plan
    wants, else :class:`~vgpu_state.kube.guardedpatch.PatchCheckError` is raised and
    nothing is sent.

    On 409 or 422 (the CR changed since the read: a ``test`` op failed) read again,
    compute again and retry after a jittered backoff. A 422 on a CR that did not
    change since it was read is a real refusal and is raised at once; after
    ``attempts`` lost races :class:`ContendedWriteError` is raised.
    """
    rng = rng or random.Random()
    result = WriteResult(ref)
    cr = read(api, ref)
    for attempt in range(attempts):
        p = compute(cr)
        result.attempts = attempt + 1
        result.foreign = p.foreign
        if not p.patch:
            return result
        try:
            wanted = p.wanted if p.wanted is not None else cr
            guardedpatch.send(api, ref.path, cr, p.patch, wanted, f"KubeVirt CR {ref}")
        except (ConflictError, InvalidError) as e:
            result.conflicts += 1
            fresh = read(api, ref)
            if isinstance(e, InvalidError) and _rv(fresh) == _rv(cr):
                raise ClusterError(
                    f"KubeVirt CR {ref}: the API server refused the update although the CR did "
                    f"not change since it was read: {e}"
                ) from e
            delay = backoff.delay(result.conflicts, rng)
            log.debug("KubeVirt CR %s changed meanwhile (%s); retrying in %.3f s", ref, e, delay)
            sleep(delay)
            cr = read(api, ref)
            continue
        result.changes = p.changes
        result.writes = 1
        for change in p.changes:
            log.info("%s", change.describe(ref))
        return result
    raise ContendedWriteError(
        f"KubeVirt CR {ref}: {result.conflicts} concurrent changes in a row; the write is "
        "retried on the next pass"
    )


def _rv(cr: Mapping[str, Any]) -> str:
    return str(_get(cr, "metadata", "resourceVersion") or "")
