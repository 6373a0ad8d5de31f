"""The simulated tree, kept up to date part by part after each write, is the tree a
fresh render of the same driver state gives: same files, same contents, same
directory listings (in any order, as readdir gives no order)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.model.errors import DriverError
from vgpu_state.model.snapshot import SysfsInterface
from vgpu_state.sim.dirtree import materialize
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.tree import RESET_CONTROL, Renderer, Tree, render

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


def _on_disk(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under ``root``: its kind, mode and contents (or link target)."""
    found: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir",)
        else:
            found[rel] = ("file", path.stat().st_mode & 0o777, path.read_bytes())
    return found


@pytest.mark.parametrize("spec", ["mixed.yaml", "a16-board.yaml", "l40s-pair.yaml"])
def test_the_directory_tree_after_writes_is_a_fresh_one(spec: str, tmp_path: Path) -> None:
    """The directory frontend rewrites only what a write changed: after every write,
    a reset and an SR-IOV change, the files on disk are those of a fresh tree."""
    host = SimHost(SIM / spec, root=tmp_path / "live", catalog=CATALOG)
    fresh = 0

    def check() -> None:
        nonlocal fresh
        fresh += 1
        where = tmp_path / f"fresh-{fresh}"
        materialize(render(host.sysfs.driver), str(where))
        assert _on_disk(tmp_path / "live") == _on_disk(where)

    uuids = (f"11111111-2222-4333-8444-{n:012d}" for n in itertools.count())
    for g in host.scan().gpus:
        for v in g.vgpus:
            try:
                if v.kind == "vf":
                    host.clear_vf_type(v.parent)
                else:
                    assert v.uuid is not None
                    host.remove_mdev(v.uuid)
            except DriverError:
                pass
            check()
        for parent, creatable in [(vf.address, vf.creatable) for vf in g.vfs][:2]:
            if creatable and g.layout is SysfsInterface.VENDOR_VFIO:
                host.set_vf_type(parent, creatable[0].type_id)
            elif creatable:
                host.create_mdev(parent, creatable[0].type_id, next(uuids))
            check()
    for g in host.scan().gpus:
        if g.sriov_numvfs and not g.vgpus:
            host.disable_sriov(g.address)
            check()
    host.write(RESET_CONTROL, "1")
    check()
    host.close()
