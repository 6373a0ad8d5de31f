"""End to end: a FUSE-mounted simulated node, ``vgpu-state apply``, the plugin, a fake kubelet.

After the apply the plugin is refreshed from a fresh scan of the mount (what the
agent does after every apply); the kubelet must then see exactly the node's
vGPUs, and Allocate must hand out the env var KubeVirt reads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent

CASES = {
    "mdev": ("t4-pair.yaml", "t4", "T4-4Q: 4", "nvidia.com/GRID_T4-4Q", "MDEV_PCI_RESOURCE"),
    "vendor-vfio": (
        "l40s-pair.yaml", "l40s", "L40S-4Q: 3", "nvidia.com/NVIDIA_L40S-4Q", "PCI_RESOURCE",
    ),
}  # fmt: skip


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpe-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.usefixtures("require_fuse")
@pytest.mark.parametrize("case", sorted(CASES))
def test_apply_then_kubelet_sees_new_devices_and_allocates_them(
    case: str, tmp_path: Path, plugin_dir: Path
) -> None:
    spec_name, config, entry, resource, env_prefix = CASES[case]
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        f"version: v1\nvgpu-configs:\n  {config}:\n    - devices: all\n"
        f"      vgpu-devices: {{{entry}}}\n"
    )
    with (
        mounted(REPO / "configs" / "sim" / spec_name, tmp_path / "mnt") as m,
        DevicePluginKubelet(str(plugin_dir)) as kubelet,
    ):
        root = str(m.root)
        plugins = DevicePluginManager(str(plugin_dir), poll_interval=0.02, iommufd=False)
        try:
            before = scan(root, catalog=CATALOG)
            plugins.refresh(before)
            old = {v.key for g in before.gpus for v in g.vgpus}
            kubelet.wait_for(resource, lambda d: {x.id for x in d} == old)

            applied = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "vgpu_state.cli.main",
                    "apply",
                    "-f",
                    str(layout),
                    "-c",
                    config,
                    "--sysfs-root",
                    root,
                    "--node",
                    "n1",
                    "--auto-approve",
                    "--state-dir",
                    str(tmp_path / "state"),
                ],
                capture_output=True,
                text=True,
            )
            assert applied.returncode == 0, applied.stdout + applied.stderr

            after = scan(root, catalog=CATALOG)
            now = {v.key for g in after.gpus for v in g.vgpus}
            new = sorted(now - old)
            assert new and old <= now
            started = time.perf_counter()
            plugins.refresh(after)
            seen = kubelet.wait_for(resource, lambda d: {x.id for x in d} == now)
            print(
                f"{case}: refresh -> kubelet list {1000 * (time.perf_counter() - started):.1f} ms"
            )
            assert {d.health for d in seen} == {"Healthy"}
            assert len(seen) == len(now)

            got = kubelet.allocate(resource, new[:2]).container_responses[0]
            env = env_prefix + "_" + resource.upper().replace("/", "_").replace(".", "_")
            assert dict(got.envs) == {env: ",".join(new[:2])}
            group_of = {v.key: v.iommu_group for g in after.gpus for v in g.vgpus}
            assert [d.host_path for d in got.devices] == [
                "/dev/vfio/vfio",
                *(f"/dev/vfio/{group_of[key]}" for key in new[:2]),
            ]
            for key in new[:2]:
                link = os.readlink(os.path.join(_device_path(root, key), "iommu_group"))
                assert os.path.basename(link) == str(group_of[key])
        finally:
            plugins.stop()
        assert kubelet.wait_for(resource, lambda d: d == ()) == ()


def _device_path(root: str, key: str) -> str:
    if ":" in key:
        return os.path.join(root, "bus", "pci", "devices", key)
    return os.path.join(root, "bus", "mdev", "devices", key)
