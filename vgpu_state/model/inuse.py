"""``InUse``: which vGPUs a pod or VM holds, by key (mdev UUID or VF address) -> holder."""

from __future__ import annotations

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
