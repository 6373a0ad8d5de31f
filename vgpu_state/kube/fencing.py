"""The writer's term: the fencing token every write of the cluster controller carries (pure).

A *term* is one unbroken hold of the controller's Lease by one process. It
begins when a replica creates the Lease, takes it from another identity, or
takes it after the last hold ended (expired or released) — even when the
identity is its own, e.g. a restarted pod that kept its name — and it ends
when any other term begins. Every beginning is a guarded write of the Lease
that raises ``spec.leaseTransitions`` and sets a new ``spec.acquireTime``
(:func:`vgpu_state.kube.lease.hold_term`), so of two terms of one Lease the
later has the higher number, and no two terms have the same token.

The token, ``<leaseTransitions>/<holderIdentity>/<acquireTime>``, is kept in
the KubeVirt CR's annotation ``vgpu-state.io/writer-term``. A replica only ever
writes its own term's token there, and every patch it sends tests the
annotation: for its own token, or — the first write of its term, the *claim* —
for the older token it read. Once a newer term has claimed the CR, a write of
an older term fails at the API server, however late it arrives.

What a replica makes of the token it reads (:func:`standing`):

* its own: the CR is claimed; write with a ``test`` of it;
* none, unreadable, or of a lower number: an older term's; claim the CR;
* anything else (a higher number, or the same number with another holder or
  start): a newer term claimed the CR. The replica writes nothing and
  re-checks its Lease; it stops unless the Lease still shows its own term, in
  which case the Lease was reset (deleted and created again) and the replica
  starts a term numbered past the CR's (:func:`next_number`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_state.model.errors import TransientError

WRITER_TERM_ANNOTATION = "vgpu-state.io/writer-term"
MAX_NUMBER = 2**31 - 1
"""``spec.leaseTransitions`` is an int32."""
MAX_TOKEN = 1024
"""Characters; a longer annotation value is no term's token (unreadable)."""
_NUMBER = re.compile(r"0|[1-9][0-9]{0,9}")


@dataclass(frozen=True)
class Term:
    """One hold of the Lease: its number (``leaseTransitions``), holder and start."""

    number: int
    holder: str
    acquired: str
    """The Lease's ``acquireTime`` as the API server stored it."""

    @property
    def token(self) -> str:
        return f"{self.number}/{self.holder}/{self.acquired}"

    def __str__(self) -> str:
        return f"term {self.number} of {self.holder} (since {self.acquired or 'unknown'})"


def term_of(lease: Mapping[str, Any]) -> Term | None:
    """The term a Lease shows; ``None`` when it is released or its fields are unusable."""
    spec = lease.get("spec")
    if not isinstance(spec, Mapping):
        return None
    holder, acquired = spec.get("holderIdentity"), spec.get("acquireTime")
    number = spec.get("leaseTransitions") or 0
    if not isinstance(holder, str) or not holder or not isinstance(number, int):
        return None
    if isinstance(number, bool) or not 0 <= number <= MAX_NUMBER:
        return None
    return Term(number, holder, acquired if isinstance(acquired, str) else "")


def parse_token(text: object) -> Term | None:
    """The term a token names; ``None`` when ``text`` is no token (bounded: see
    :data:`MAX_TOKEN`)."""
    if not isinstance(text, str) or len(text) > MAX_TOKEN:
        return None
    number, sep, rest = text.partition("/")
    holder, sep2, acquired = rest.rpartition("/")
    if not sep or not sep2 or not holder or not _NUMBER.fullmatch(number):
        return None
    value = int(number)
    # A number no Lease can go past cannot be a real term's (nor can one be started after it).
    if value >= MAX_NUMBER:
        return None
    return Term(value, holder, acquired)


class Standing(enum.Enum):
    """Whose the CR's writer-term annotation is, seen from one term."""

    OWN = "own"
    """This term's token: the CR is claimed."""
    OLDER = "older"
    """No token, an unreadable one, or a lower-numbered term's: this term may claim the CR."""
    NEWER = "newer"
    """Another term that is not older claimed the CR: this one writes nothing."""


def standing(seen: object, own: Term) -> Standing:
    """Whose the token ``seen`` (the annotation's value; ``None``: absent) is, for ``own``."""
    if seen == own.token:
        return Standing.OWN
    other = parse_token(seen)
    if other is None or other.number < own.number:
        return Standing.OLDER
    return Standing.NEWER


def next_number(seen: object, current: int) -> int:
    """The number of the term that follows ``current`` and is past the token ``seen``."""
    other = parse_token(seen)
    past = other.number if other is not None else -1
    return min(MAX_NUMBER, max(current, past) + 1)


def seen_token(cr: Mapping[str, Any]) -> object:
    """The CR's writer-term annotation (``None`` when it has none)."""
    meta = cr.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations.get(WRITER_TERM_ANNOTATION) if isinstance(annotations, Mapping) else None


class DeposedError(TransientError):
    """This replica's term has ended (a newer term claimed the CR, or the Lease moved on): it
    writes nothing more until it leads again."""

    def __init__(self, message: str, seen: object = None) -> None:
        super().__init__(message)
        self.seen = seen
        """The CR's writer-term token that showed it, if a read of the CR did."""
