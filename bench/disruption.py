#!/usr/bin/env python3
"""Disruption: vGPUs destroyed and created per layout transition, vgpu-state vs clear-and-recreate.

Every transition starts from a simulated node whose GPU holds the "from"
layout (written into the simulator spec, so the driver's own rules create
it), is planned by vgpu-state (prune on) and applied through the simulated
driver, which must end at the "to" layout. The clear-and-recreate strategy of
vgpu-device-manager destroys every vGPU of a GPU whose layout changed and
creates the whole target. Exits 1 when vgpu-state destroys more than
clear-and-recreate on any transition, or destroys anything on pure growth.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from dataclasses import dataclass

from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.reconcile import Mode, Ports, Settings, reconcile_once
from vgpu_state.sim.node import open_sim
from vgpu_state.sim.spec import GpuSpec, NodeSpec, VgpuSpec

CATALOG = default_catalog()

Layout = dict[str, int]
ADDRESS = "0000:3b:00.0"


@dataclass(frozen=True)
class Transition:
    category: str
    model: str
    layout: str
    before: Layout
    after: Layout


# model, sysfs layout, two types of one framebuffer size (different series), one of another size
MODELS = (
    ("A2", "mdev", "A2-4Q", "A2-4C", "A2-2Q"),
    ("A16", "mdev", "A16-4Q", "A16-4C", "A16-2Q"),
    ("T4", "mdev", "T4-4Q", "T4-4C", "T4-8Q"),
    ("A40", "mdev", "A40-4Q", "A40-4C", "A40-8Q"),
    ("L40S", "vendor-vfio", "L40S-4Q", "L40S-4A", "L40S-2B"),
    ("A10", "vendor-vfio", "A10-4Q", "A10-4C", "A10-8Q"),
)


def transitions() -> list[Transition]:
    out: list[Transition] = []
    for model, layout, p, r, z in MODELS:
        m = default_catalog().find_model(model)
        t = m.type(p) if m else None
        assert t is not None, p
        half = max(2, t.max_instances // 2)
        pairs: list[tuple[str, Layout, Layout]] = [
            ("growth", {}, {p: 2}),
            ("growth", {p: 1}, {p: half}),
            ("growth", {p: 2}, {p: 2, r: 2}),
            ("growth", {p: 1, r: 1}, {p: 2, r: 2}),
            ("shrink", {p: half}, {p: 1}),
            ("shrink", {p: 2, r: 2}, {p: 2}),
            ("shrink", {p: 2}, {}),
            ("same-size swap", {p: 2}, {r: 2}),
            ("same-size swap", {p: 3}, {p: 1, r: 2}),
            ("size change", {p: 2}, {z: 1}),
            ("size change", {z: 1}, {p: 3}),
            ("series mix", {p: 3}, {p: 2, r: 1}),
            ("series mix", {p: 1, r: 2}, {p: 2, r: 1}),
        ]
        out += [Transition(c, model, layout, b, a) for c, b, a in pairs]
    return out


def spec(t: Transition) -> NodeSpec:
    m = default_catalog().find_model(t.model)
    assert m is not None
    names = [name for name, count in sorted(t.before.items()) for _ in range(count)]
    vgpus = tuple(
        VgpuSpec(type=name, vf=i if m.sriov_capable else None) for i, name in enumerate(names)
    )
    gpu = GpuSpec(address=ADDRESS, model=t.model, layout=t.layout, vgpus=vgpus)
    return NodeSpec(node="disruption", gpus=(gpu,))


def vgpu_state_counts(t: Transition) -> tuple[int, int]:
    """(destroyed, created) by vgpu-state's plan, applied to the simulator."""
    wanted = ", ".join(f"{name}: {count}" for name, count in sorted(t.after.items()))
    config = load_text(
        "version: v1\npolicy: {prune: true}\nvgpu-configs:\n  disruption:\n"
        f'    - devices: ["{ADDRESS}"]\n      vgpu-devices: {{{wanted}}}\n',
        "disruption.yaml", catalog=CATALOG
    )
    node = open_sim(spec(t))
    try:
        ports = Ports(node.host, node.cluster, StaticConfigSource(config))
        settings = Settings(catalog=default_catalog())
        report = reconcile_once(ports, settings, mode=Mode.APPLY, config_name="disruption")
    finally:
        node.close()
    p = report.plan
    assert not p.blocked, p.blocked
    live = Counter(v.type_name for v in report.final.gpus[0].vgpus)
    assert live == Counter(t.after) and report.converged, (t, live)
    return p.summary.destroy, p.summary.create


def clear_and_recreate(t: Transition) -> tuple[int, int]:
    if Counter(t.before) == Counter(t.after):
        return 0, 0
    return sum(t.before.values()), sum(t.after.values())


def main() -> int:
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    failures: list[str] = []
    all_transitions = transitions()
    for t in all_transitions:
        vd, vc = vgpu_state_counts(t)
        cd, cc = clear_and_recreate(t)
        for key in (t.category, "total"):
            row = rows[key]
            row[0] += 1
            row[1] += vd
            row[2] += vc
            row[3] += cd
            row[4] += cc
        name = f"{t.model} {t.layout} {t.category}: {t.before} -> {t.after}"
        if vd > cd:
            failures.append(f"{name}: vgpu-state destroys {vd}, clear-and-recreate {cd}")
        if t.category == "growth" and vd:
            failures.append(f"{name}: growth destroyed {vd} vGPU(s)")
    header = (
        f"{'category':16s} {'transitions':>11s} {'vs destroy':>10s} {'vs create':>9s} "
        f"{'c&r destroy':>11s} {'c&r create':>10s} {'destroy ratio':>13s}"
    )
    print(header)
    order = ["growth", "shrink", "same-size swap", "size change", "series mix", "total"]
    for key in order:
        n, vd, vc, cd, cc = rows[key]
        ratio = f"{vd / cd:.2f}" if cd else "-"
        print(f"{key:16s} {n:11d} {vd:10d} {vc:9d} {cd:11d} {cc:10d} {ratio:>13s}")
    n, vd, vc, cd, cc = rows["total"]
    print(
        f"{n} transitions over {len(MODELS)} GPU models: vgpu-state destroys {vd} and creates "
        f"{vc} vGPUs; clear-and-recreate destroys {cd} and creates {cc} "
        f"({vd / cd:.2f} of the destroys, {(vd + vc) / (cd + cc):.2f} of all operations)"
    )
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
