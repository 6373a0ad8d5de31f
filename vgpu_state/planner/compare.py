"""Does a node match its desired layout? The comparison ``assert`` and every apply end with."""

from __future__ import annotations

from collections import Counter

from vgpu_state.model.desired import DesiredState
from vgpu_state.model.snapshot import NodeSnapshot


def differences(desired: DesiredState, snapshot: NodeSnapshot) -> tuple[str, ...]:
    """One line per type whose count on a managed GPU differs from the layout's.

    Empty when the node matches. ``snapshot`` must be a fresh scan.
    """
    lines: list[str] = []
    for dg in desired.gpus:
        g = snapshot.gpu(dg.address)
        live = Counter(v.type_label for v in (g.vgpus if g else ()))
        want = Counter({n: c for n, c in dg.types if c})
        for name in sorted(set(live) | set(want)):
            if live[name] < want[name]:
                lines.append(
                    f"gpu[{dg.address}]: {want[name] - live[name]} × {name} missing "
                    f"(want {want[name]}, have {live[name]})"
                )
            elif live[name] > want[name]:
                lines.append(
                    f"gpu[{dg.address}]: {live[name] - want[name]} × {name} not wanted "
                    f"(want {want[name]}, have {live[name]})"
                )
    return tuple(lines)
