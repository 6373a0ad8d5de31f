"""Does a node match its desired layout? The comparison ``assert`` and every apply end with."""

from __future__ import annotations

from collections import Counter

from vgpu_state.model.desired import DesiredGpu, DesiredState
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.model.snapshot import Gpu, NodeSnapshot
from vgpu_state.planner.modes import MODE_TEXT, desired_mode


def differences(desired: DesiredState, snapshot: NodeSnapshot) -> tuple[str, ...]:
    """One line per type whose count on a managed GPU differs from the layout's, and
    one for a GPU whose mode (or MIG geometry) differs, where its modes were read.

    Empty when the node matches. ``snapshot`` must be a fresh scan.
    """
    lines: list[str] = []
    for dg in desired.gpus:
        g = snapshot.gpu(dg.address)
        lines.extend(mode_differences(dg, g))
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


def mode_differences(dg: DesiredGpu, g: Gpu | None) -> list[str]:
    """How ``g``'s read modes differ from ``dg``'s mode and MIG geometry (none when the
    modes were not read: the layout's planning error says so)."""
    if g is None or g.modes is None:
        return []
    want = desired_mode(dg)
    have = g.modes.mode
    if have is not want:
        return [f"gpu[{dg.address}]: {MODE_TEXT[have]} mode (want {MODE_TEXT[want]})"]
    if want is GpuMode.MIG and dg.mig_geometry:
        live = g.modes.gi_counts()
        wanted = dict(dg.mig_geometry)
        if live != wanted:
            text = ", ".join(f"{p} × {n}" for p, n in sorted(live.items())) or "none"
            want_text = ", ".join(f"{p} × {n}" for p, n in sorted(wanted.items()))
            return [f"gpu[{dg.address}]: GPU instances {text} (want {want_text})"]
    return []
