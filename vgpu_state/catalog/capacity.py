"""The driver's capacity rule for one GPU, in one place.

vGPUs on one GPU share one framebuffer size (series of the same size may mix,
a MIG-backed type is never the same size as a time-sliced one); no type
exceeds its ``max_instances``; all of them together fit the smallest
``max_instances`` among them (the GPU's framebuffer divided by the size).

Config validation, the planner, the driver simulator and the test builders
ask these functions; each words its own messages from the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vgpu_state.catalog.catalog import VgpuType


def size_key(t: VgpuType) -> tuple[int, bool]:
    """What must be equal for two types to share a GPU: framebuffer and MIG-backing."""
    return (t.framebuffer_mib, t.is_mig)


def same_size(types: Iterable[VgpuType]) -> bool:
    """True when the types can share one GPU under the equal-framebuffer rule."""
    return len({size_key(t) for t in types}) <= 1


@dataclass(frozen=True)
class Fit:
    """Whether counts of types fit one GPU, and how they do not."""

    mixed_sizes: bool
    """The types do not share one framebuffer size."""
    over_type: tuple[tuple[VgpuType, int], ...]
    """``(type, count)`` for each count above that type's ``max_instances``."""
    over_total: tuple[int, int, int] | None
    """``(total, limit, framebuffer_mib)`` when the counts together exceed the
    smallest ``max_instances`` (checked only when neither problem above exists)."""

    @property
    def ok(self) -> bool:
        return not self.mixed_sizes and not self.over_type and self.over_total is None


def check_fit(counts: Sequence[tuple[VgpuType | None, int]]) -> Fit:
    """Check ``(type, count)`` pairs wanted on one GPU.

    ``None`` stands for a type nobody describes: its count adds to the total but
    it states no size and no limit. Pairs keep their order in ``over_type``.
    """
    known = [(t, n) for t, n in counts if t is not None]
    mixed = not same_size(t for t, _ in known)
    over = tuple((t, n) for t, n in known if n > t.max_instances)
    over_total: tuple[int, int, int] | None = None
    if not mixed and not over and known:
        total = sum(n for _, n in counts)
        limit = min(t.max_instances for t, _ in known)
        if total > limit:
            over_total = (total, limit, known[0][0].framebuffer_mib)
    return Fit(mixed_sizes=mixed, over_type=over, over_total=over_total)


def remaining(t: VgpuType, existing: Sequence[VgpuType | None]) -> int:
    """How many more vGPUs of ``t`` fit beside the ``existing`` ones on one GPU.

    0 when one of them has another framebuffer size; else ``t``'s
    ``max_instances`` less what exists (never below 0). ``None`` is a vGPU whose
    type nobody describes: it takes an instance and states no size. Virtual
    functions, when the GPU has them, may limit it further; the caller knows those.
    """
    if not same_size((t, *(e for e in existing if e is not None))):
        return 0
    return max(t.max_instances - len(existing), 0)
