"""``InUse``: which vGPUs a pod or VM holds, by key (mdev UUID or VF address) -> holder."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import TypeVar, overload

T = TypeVar("T")


class InUse(Mapping[str, str]):
    """An immutable mapping of vGPU key to the pod or VM that holds it.

    Keys are what :attr:`vgpu_state.model.snapshot.Vgpu.key` gives: the mdev
    UUID, or the VF address in the vendor-specific VFIO layout. Holders are
    free text that plans print (``pod default/vm-a``, ``VM web-1``).
    """

    __slots__ = ("_held",)

    def __init__(self, held: Mapping[str, str] | None = None) -> None:
        self._held: dict[str, str] = dict(sorted((held or {}).items()))

    def __getitem__(self, key: str) -> str:
        return self._held[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    # The dictionary's own lookups: Mapping's would raise and catch a KeyError for every
    # vGPU nobody holds (most of them), on every plan.
    def __contains__(self, key: object) -> bool:
        return key in self._held

    @overload
    def get(self, key: str, /) -> str | None: ...

    @overload
    def get(self, key: str, default: str | T, /) -> str | T: ...

    def get(self, key: str, default: object = None, /) -> object:
        return self._held.get(key, default)

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"InUse({self._held!r})"

    def __hash__(self) -> int:
        return hash(tuple(self._held.items()))

    def merged(self, other: Mapping[str, str]) -> InUse:
        """These holders and ``other``'s; ``other`` wins for a key both name."""
        return InUse({**self._held, **other})


_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_VM_HOLDER = re.compile(
    rf"^pod (?P<ns>{_DNS_LABEL})/virt-launcher-(?P<launcher>{_DNS_SUBDOMAIN})-[a-z0-9]{{5}} "
    rf"\(VM (?P=ns)/(?P<vm>{_DNS_SUBDOMAIN})\)$"
)
MAX_HOLDER_TEXT = 1024
"""A holder text longer than this is not read as a VM (names are at most 317 characters)."""


def holder_vm(holder: str) -> str | None:
    """``namespace/name`` of the KubeVirt VM a holder text names, else ``None``.

    The kubelet's pod-resources list names a holder ``pod <ns>/<pod>``, and a
    virt-launcher pod ``pod <ns>/virt-launcher-<vm>-<5 chars> (VM <ns>/<vm>)``. Only
    that second form, with the VM's name the one in the pod's name and both names
    Kubernetes names (a DNS label for the namespace, a DNS subdomain of at most 253
    characters for the VM), is a VM; anything else (a plain pod, a process, free text
    given on the command line) is not.
    """
    if len(holder) > MAX_HOLDER_TEXT:
        return None
    m = _VM_HOLDER.match(holder)
    if m is None or m.group("launcher") != m.group("vm") or len(m.group("vm")) > 253:
        return None
    return f"{m.group('ns')}/{m.group('vm')}"
