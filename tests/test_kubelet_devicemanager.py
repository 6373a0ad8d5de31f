"""The device plugin against the kubelet's own device manager (``pkg/kubelet/cm/devicemanager``).

``hack/k8s/cmd/kubelet-harness devicemanager`` runs the Kubernetes release's
device manager on a temp directory as the kubelet runs it: it serves
``kubelet.sock``, vgpu-state's plugin registers there, the manager dials the
plugin, ListAndWatch feeds its healthy-device sets (what the kubelet writes into
the Node's allocatable), and Allocate for a container goes through the
manager's own device choice, GetPreferredAllocation, Allocate and its run
options (env, devices).

The one part not reached through an exported entry point: ``NewManagerImpl``
fixes the socket at ``/var/lib/kubelet/device-plugins/kubelet.sock``; the harness
calls the manager's own constructor behind it (``newManagerImpl``, via
``go:linkname``) with the temp directory's socket, as the manager's unit tests
do. Everything after construction is the kubelet's code path.

The node: a simulated A2 (mdev vGPUs on VFs) and a simulated L40S (vendor VFIO:
a vGPU type on each VF), rendered as a sysfs tree; ``vgpu-state apply`` changes
it, and a fresh scan feeds the plugin, as the agent does after every apply.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.kubelet_harness import require_harness, running
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.sim.host import SimHost

REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "configs" / "sim"
CATALOG = default_catalog()

# spec, config name, layout, env prefix KubeVirt reads for the node's kind of vGPU
CASES = {
    "a2-mdev": ("a2-host.yaml", "a2", "{A2-4C: 1, A2-4Q: 2, A2-4A: 1}", "MDEV_PCI_RESOURCE"),
    "l40s-vendor-vfio": ("l40s-pair.yaml", "render", "{L40S-4Q: 3}", "PCI_RESOURCE"),
}  # fmt: skip


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kdm-", dir="/tmp"))  # unix socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.stdout


def _env(prefix: str, resource: str) -> str:
    """KubeVirt's name for the variable: upper case, ``/`` and ``.`` as ``_``."""
    return f"{prefix}_{resource.upper().replace('/', '_').replace('.', '_')}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kubelets_device_manager_counts_the_plan_and_allocates_kubevirts_env(
    case: str, tmp_path: Path, short_dir: Path
) -> None:
    require_harness()
    spec_name, config, layout, prefix = CASES[case]
    spec = tmp_path / spec_name
    shutil.copy(SIM / spec_name, spec)
    cfg = tmp_path / "layout.yaml"
    cfg.write_text(f"version: v1\nvgpu-configs:\n  {config}:\n    - devices: all\n"
                   f"      vgpu-devices: {layout}\n")  # fmt: skip
    sim = ["--sim", str(spec), "-c", config]
    planned = json.loads(_run("plan", "-f", str(cfg), *sim, "-o", "json"))
    assert planned["actions"], "the plan must change the node"
    expected = {
        c["resource"]: c["after"]
        for c in planned["capacity"]
        if c["publish"] == "device-plugin" and c["after"]
    }
    assert expected
    _run("apply", "-f", str(cfg), *sim, "--auto-approve",
         "--state-dir", str(tmp_path / "state"))  # fmt: skip

    plugin_dir = short_dir / "device-plugins"
    host = SimHost(spec)
    plugins = DevicePluginManager(str(plugin_dir), poll_interval=0.05, iommufd=False)
    try:
        with running("devicemanager", "--dir", str(plugin_dir), log=tmp_path / "kubelet.log") as k:
            snapshot = host.scan()
            plugins.refresh(snapshot)
            seen = k.wait_for(
                "the kubelet's allocatable", "capacity",
                lambda a: {r: n for r, n in a["allocatable"].items() if n} == expected,
            )  # fmt: skip
            print(f"{case}: kubelet allocatable {seen['allocatable']} == plan {expected}")
            assert seen["capacity"] == seen["allocatable"]  # every device healthy
            keys = {v.key: v for g in snapshot.gpus for v in g.vgpus}
            for resource, ids in seen["healthy"].items():
                assert set(ids) <= set(keys), resource

            resource = max(expected, key=lambda r: expected[r])
            want = min(2, expected[resource])
            got = k.ask("allocate", pod="vm-1", limits={resource: want})
            assert "error" not in got, got
            ids = got["device_ids"][resource]
            assert len(ids) == want and set(ids) <= set(seen["healthy"][resource])
            print(f"{case}: Allocate {resource} x{want} -> env {got['envs']}")
            assert set(got["envs"]) == {_env(prefix, resource)}
            assert sorted(got["envs"][_env(prefix, resource)].split(",")) == ids
            groups = sorted(f"/dev/vfio/{keys[i].iommu_group}" for i in ids)
            assert sorted(d["host"] for d in got["devices"]) == sorted(["/dev/vfio/vfio", *groups])
            assert {d["permissions"] for d in got["devices"]} == {"mrw"}
            for key in ids:  # the group the plugin gave is the one sysfs shows
                path = "bus/mdev/devices" if prefix.startswith("MDEV") else "bus/pci/devices"
                link = Path(host.root, path, key, "iommu_group").resolve()
                assert f"/dev/vfio/{link.name}" in groups

            # The kubelet's books: the allocated devices are no longer free for another pod.
            rest = expected[resource] - want
            other = k.ask("allocate", pod="vm-2", limits={resource: rest + 1})
            assert "requested number of devices unavailable" in other.get("error", ""), other

            plugins.stop()  # the plugin sends an empty list, then goes
            k.wait_for(
                "allocatable after the plugin stopped", "capacity",
                lambda a: not any(a["allocatable"].get(r) for r in expected),
            )  # fmt: skip
    finally:
        plugins.stop()
        host.close()
