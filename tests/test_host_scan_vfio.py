"""What a VM needs from a scan: full type names, IOMMU groups and VFIO cdevs of each vGPU."""

from __future__ import annotations

import os
from pathlib import Path

from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan
from vgpu_state.sim.host import SimHost

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "configs" / "sim"


def test_mdev_carries_its_own_iommu_group_and_driver_type_name() -> None:
    with SimHost(SIM / "t4-pair.yaml") as host:
        snapshot = host.scan()
        mdevs = [v for g in snapshot.gpus for v in g.vgpus]
        assert {v.type_sysfs_name for v in mdevs} == {"GRID T4-4Q"}
        assert {v.type_name for v in mdevs} == {"T4-4Q"}
        for v in mdevs:
            assert v.uuid is not None and v.iommu_group is not None
            link = os.readlink(os.path.join(host.root, "bus/mdev/devices", v.uuid, "iommu_group"))
            assert int(os.path.basename(link)) == v.iommu_group
        pf_groups = {g.iommu_group for g in snapshot.gpus}
        assert not pf_groups & {v.iommu_group for v in mdevs}
        assert len({v.iommu_group for v in mdevs}) == len(mdevs)


def test_vendor_vfio_vgpu_has_its_vf_group_and_cdev() -> None:
    with SimHost(SIM / "l40s-pair.yaml") as host:
        snapshot = host.scan()
        vfs = [(g, v) for g in snapshot.gpus for v in g.vgpus]
        assert vfs
        for g, v in vfs:
            vf = g.vf(v.parent)
            assert vf is not None
            assert v.iommu_group == vf.iommu_group is not None
            assert v.vfio_cdev == f"vfio{vf.iommu_group}"
            assert v.type_sysfs_name == f"NVIDIA {v.type_name}"


def test_a_vf_without_cdev_directory_has_no_cdev(tmp_path: Path) -> None:
    with SimHost(SIM / "l40s-pair.yaml") as host:
        v = next(v for g in host.scan().gpus for v in g.vgpus)
        vfio_dev = os.path.join(host.root, "bus/pci/devices", v.parent, "vfio-dev")
        for name in os.listdir(vfio_dev):
            os.rmdir(os.path.join(vfio_dev, name))
        again = next(
            x
            for g in scan(host.root, catalog=CATALOG).gpus
            for x in g.vgpus
            if x.parent == v.parent
        )
        assert again.vfio_cdev is None and again.iommu_group == v.iommu_group
