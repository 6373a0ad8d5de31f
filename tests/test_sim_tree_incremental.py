"""The simulated tree, kept up to date part by part after each write, is the tree a
fresh render of the same driver state gives: same files, same contents, same
directory listings (in any order, as readdir gives no order)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.model.errors import DriverError
from vgpu_state.model.snapshot import SysfsInterface
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.tree import Renderer, Tree

CATALOG = default_catalog()
SIM = Path(__file__).resolve().parent.parent / "configs" / "sim"


def _same(live: Tree, fresh: Tree) -> None:
    assert live.entries == fresh.entries
    assert {d: sorted(n) for d, n in live.children.items()} == {
        d: sorted(n) for d, n in fresh.children.items()
    }


@pytest.mark.parametrize("spec", ["mixed.yaml", "a16-board.yaml", "l40s-pair.yaml", "t4-pair.yaml"])
def test_the_tree_after_writes_is_a_fresh_render_of_the_state(spec: str) -> None:
    host = SimHost(SIM / spec, in_memory=True, catalog=CATALOG)
    uuids = (f"11111111-2222-4333-8444-{n:012d}" for n in itertools.count())
    for _round in range(2):
        for g in host.scan().gpus:
            # Destroy what can be destroyed, then fill two parents with the first type listed.
            for v in g.vgpus:
                try:
                    if v.kind == "vf":
                        host.clear_vf_type(v.parent)
                    else:
                        assert v.uuid is not None
                        host.remove_mdev(v.uuid)
                except DriverError:
                    pass  # held: the driver refuses, the tree must not change
                _same(host.sysfs.tree, Renderer().render(host.sysfs.driver))
        for g in host.scan().gpus:
            if g.layout is SysfsInterface.SRIOV_DISABLED:
                host.enable_sriov(g.address)
                continue
            parents = [(vf.address, vf.creatable) for vf in g.vfs] or [
                (g.address, g.pf_creatable)
            ]
            for parent, creatable in parents[:2]:
                if not creatable:
                    continue
                if g.layout is SysfsInterface.VENDOR_VFIO:
                    host.set_vf_type(parent, creatable[0].type_id)
                else:
                    host.create_mdev(parent, creatable[0].type_id, next(uuids))
                _same(host.sysfs.tree, Renderer().render(host.sysfs.driver))
    assert any(v for g in host.scan().gpus for v in g.vgpus)
