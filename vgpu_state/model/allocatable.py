"""Does the kubelet offer what the device plugin advertised? (pure)

The device plugin tells the kubelet, per extended resource, which devices it
has and whether each is healthy; the kubelet turns that into the Node's
``status.capacity`` (every device) and ``status.allocatable`` (the healthy
ones), and the scheduler places pods and VMs by ``allocatable`` alone. A lost
registration, a kubelet bug or a stale status leaves the scheduler with a
different number than the node really has: VMs stay Pending on a node full of
free vGPUs, or land on one that has none.

:func:`check` compares the two, per resource, as the ``KubeletAllocatable``
condition of the node's status reports it:

* ``True`` (:attr:`AllocatableReason.MATCHES`): for every resource the plugin
  advertises, ``allocatable`` equals its healthy devices, and every resource it
  stopped advertising is 0 or absent.
* ``Unknown`` (:attr:`AllocatableReason.AWAITING_KUBELET`): they differ, but the
  advertised list (or a registration) changed less than a grace period ago,
  so the kubelet may not have posted its node status yet; or the Node was not
  read yet (:attr:`AllocatableReason.NODE_UNREAD`).
* ``False`` (:attr:`AllocatableReason.MISMATCH`): they still differ after the
  grace period; the message names each resource, advertised vs allocatable.

Only device-plugin resources count: vGPUs published through DRA are not
extended resources and never appear in ``allocatable``; other resources of the
node (``cpu``, ``nvidia.com/gpu`` of another plugin) are not looked at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_GRACE = 40.0
"""Seconds the kubelet gets to show a new device list. The kubelet computes its
node status every 10 s (``nodeStatusUpdateFrequency``) and posts it when it
changed; 40 s is four such rounds, so one slow or failed status update does not
turn the condition False, while a lost registration is still noticed and
repaired within a minute."""


class AllocatableReason(StrEnum):
    """Reason codes of the ``KubeletAllocatable`` condition (and its Events)."""

    MATCHES = "AllocatableMatches"
    """Every device-plugin resource is allocatable exactly as advertised."""
    AWAITING_KUBELET = "AwaitingKubelet"
    """The list changed less than the grace period ago; the kubelet may not have posted it yet."""
    NODE_UNREAD = "NodeStatusUnread"
    """The Node's status has not been read yet."""
    MISMATCH = "AllocatableMismatch"
    """Some resource's allocatable differs from what the plugin advertises, past the grace."""
    REREGISTERED = "DevicePluginReregistered"
    """(Event) The kubelet showed 0 of an advertised resource; the plugin registered it again."""


@dataclass(frozen=True)
class ResourceCount:
    """One resource as the plugin advertises it and as the kubelet offers it."""

    resource: str
    advertised: int
    """Healthy devices the plugin lists (0 for a resource it stopped advertising)."""
    allocatable: int | None
    """The Node's ``status.allocatable`` (``None``: absent)."""
    capacity: int | None = None
    """The Node's ``status.capacity`` (``None``: absent)."""
    withdrawn: bool = False
    """The plugin advertised it earlier and no longer does."""

    @property
    def matches(self) -> bool:
        return (self.allocatable or 0) == self.advertised

    @property
    def lost(self) -> bool:
        """The plugin advertises devices and the kubelet offers none: the registration is lost."""
        return self.advertised > 0 and not self.allocatable

    def describe(self) -> str:
        """``R: advertised N, allocatable M`` (and the capacity when it differs: a kubelet that
        still counts the devices but offers none has lost the plugin's endpoint)."""
        allocatable = "absent" if self.allocatable is None else str(self.allocatable)
        advertised = f"{self.advertised}" + (" (withdrawn)" if self.withdrawn else "")
        text = f"{self.resource}: advertised {advertised}, allocatable {allocatable}"
        if self.capacity is not None and self.capacity != (self.allocatable or 0):
            text += f", capacity {self.capacity}"
        return text


@dataclass(frozen=True)
class AllocatableCheck:
    """The verdict, as a condition: ``status`` is ``None`` for Unknown."""

    status: bool | None
    reason: AllocatableReason
    message: str
    counts: tuple[ResourceCount, ...] = ()

    @property
    def mismatched(self) -> tuple[ResourceCount, ...]:
        return tuple(c for c in self.counts if not c.matches)

    @property
    def lost(self) -> tuple[ResourceCount, ...]:
        return tuple(c for c in self.counts if c.lost)


def check(
    advertised: Mapping[str, int],
    withdrawn: Iterable[str],
    allocatable: Mapping[str, int] | None,
    capacity: Mapping[str, int] | None = None,
    *,
    settled: bool,
    grace: float = DEFAULT_GRACE,
) -> AllocatableCheck:
    """Compare ``advertised`` (healthy devices per resource) with the Node's ``allocatable``.

    ``withdrawn``: resources the plugin advertised before and no longer does
    (they must be 0 or absent). ``allocatable`` ``None``: the Node was not read
    yet. ``settled``: the grace period has passed since the advertised list
    (or a registration) last changed.
    """
    if allocatable is None:
        return AllocatableCheck(
            None, AllocatableReason.NODE_UNREAD, "the Node's status has not been read yet"
        )
    cap = capacity or {}
    gone = sorted(set(withdrawn) - set(advertised))
    counts = tuple(
        ResourceCount(r, n, allocatable.get(r), cap.get(r)) for r, n in sorted(advertised.items())
    ) + tuple(ResourceCount(r, 0, allocatable.get(r), cap.get(r), withdrawn=True) for r in gone)
    wrong = [c for c in counts if not c.matches]
    if not wrong:
        shown = [f"{c.resource}: {c.advertised}" for c in counts if not c.withdrawn]
        message = (
            "allocatable as advertised: " + ", ".join(shown)
            if shown
            else "the device plugin advertises no vGPUs"
        )
        return AllocatableCheck(True, AllocatableReason.MATCHES, message, counts)
    differences = "; ".join(c.describe() for c in wrong)
    if not settled:
        return AllocatableCheck(
            None,
            AllocatableReason.AWAITING_KUBELET,
            f"the device list changed; waiting up to {grace:g} s for the kubelet to offer it: "
            + differences,
            counts,
        )
    return AllocatableCheck(False, AllocatableReason.MISMATCH, differences, counts)


_INTEGER = re.compile(r"^[0-9]+$")


def extended_counts(resources: Mapping[str, object] | None) -> dict[str, int]:
    """The extended resources (``domain/name``) of a Node's ``capacity`` or ``allocatable``.

    Device-plugin resources are whole numbers of devices; a quantity that is
    not a plain integer (``cpu``, ``memory``, ``hugepages-…``) is left out.
    """
    out: dict[str, int] = {}
    for name, value in (resources or {}).items():
        text = str(value).strip()
        if "/" in name and _INTEGER.match(text):
            out[str(name)] = int(text)
    return out
