"""Apply creates vGPUs, the node's slices list them, a claim on one is prepared and holds it.

Real parts: the simulated node's sysfs tree, the real kube-apiserver + etcd of
the harness (``cluster``, ``tests/realcluster.py``), the DRA plugin on unix
sockets driven by a stand-in kubelet
(:class:`~vgpu_state.testing.dra_kubelet.DraKubelet`). The node's side (slices,
claims read at prepare time and as holders) talks to the server as the agent's
ServiceAccount, with a token bound to a Pod on its Node, under the shipped RBAC;
the server's own validation checks every slice and claim. The claim's allocation
(the scheduler's part) is written as a cluster admin.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource
from vgpu_state.dra.plugin import DraPlugin
from vgpu_state.dra.prepare import Preparer
from vgpu_state.dra.slices import DRIVER, MDEV_UUID, PCI_BUS_ID, build_pool
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.dra import KubeClaims, SlicePublisher, claims_in_use
from vgpu_state.model.publish import split
from vgpu_state.reconcile import Mode, Ports, Report, Settings, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import FakeCluster, dra_paths
from vgpu_state.testing.dra_kubelet import DraKubelet

CATALOG = default_catalog()

SIM = Path(__file__).resolve().parent.parent / "configs" / "sim"
NODE = "l40s-node"
SLICES = "resource.k8s.io/v1/resourceslices"
CLAIMS = "resource.k8s.io/v1/resourceclaims"


def _reconcile(
    host: SimHost, layout: str, tmp: Path, in_use: dict[str, str], mode: Mode = Mode.PLAN
) -> Report:
    config = tmp / "layout.yaml"
    config.write_text("version: v1\nvgpu-configs:\n  layout:\n" + layout)
    ports = Ports(host, FakeCluster(NODE, in_use=in_use), FileConfigSource(config, catalog=CATALOG))
    settings = Settings(catalog=default_catalog())
    return reconcile_once(ports, settings, mode=mode, config_name="layout")


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-e2e-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_apply_publish_prepare_and_a_claimed_vgpu_is_never_destroyed(
    cluster: ControlPlane, base: Path
) -> None:
    token = cluster.agent_token(NODE)  # the agent's, bound to its Pod on NODE
    client = KubeApi.connect(str(cluster.write_kubeconfig(base / "agent", token=token)))
    host = SimHost(SIM / "l40s-pair.yaml")
    plugin: DraPlugin | None = None
    kubelet: DraKubelet | None = None
    try:
        # 1. apply: four 12Q vGPUs on the second L40S, published through DRA; the first
        #    L40S is not in the layout and keeps its two 4Q on the device plugin.
        layout = (
            '    - devices: ["0000:a1:00.0"]\n      vgpu-devices: {L40S-12Q: 4}\n'
            "      publish: dra\n"
        )
        report = _reconcile(host, layout, base, {}, Mode.APPLY)
        channels = split(host.scan(), report.inputs.desired.publish_for)
        live = {v.key for g in channels.dra.gpus for v in g.vgpus}
        assert len(live) == 4
        advertised = {v.key for g in channels.device_plugin.gpus for v in g.vgpus}
        assert len(advertised) == 2 and advertised.isdisjoint(live)

        # 2. the node's slices list exactly the live DRA vGPUs, with the key KubeVirt reads.
        pool = build_pool(channels.dra, catalog=CATALOG)
        SlicePublisher(client, NODE).publish(pool)
        objs = cluster.list(SLICES)
        devices = {d["name"]: d for o in objs for d in o["spec"]["devices"]}
        published = {
            (d["attributes"].get(PCI_BUS_ID) or d["attributes"].get(MDEV_UUID))["string"]
            for d in devices.values()
        }
        assert published == live  # and none of the device plugin's
        assert all(o["spec"]["nodeName"] == NODE for o in objs)
        assert "422" not in cluster.counts, cluster.counts  # the server refused no slice

        # 3. the scheduler allocates one new 12Q to a claim of a VM's pod.
        target = next(
            d
            for d in pool.devices.values()
            if d.gpu == "0000:a1:00.0" and d.attributes["vgpuType"] == "L40S-12Q"
        )
        claim: dict[str, Any] = {
            "spec": {
                "devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "vgpu",
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": target.name,
                            }
                        ]
                    }
                },
                "reservedFor": [
                    {
                        "resource": "pods",
                        "name": "virt-launcher-render-x2x9z",
                        "uid": "8d1e6c2a-0000-4000-8000-00000000aaaa",
                    }
                ],
            },
        }
        uid = cluster.write(CLAIMS, "render-vgpu", claim, namespace="vms")["metadata"]["uid"]

        # 4. the kubelet prepares it: CDI spec with the VF's own IOMMU group.
        paths = dra_paths(base, host.root)
        preparer = Preparer(
            node=NODE, claims=KubeClaims(client), inventory=lambda: pool.devices, paths=paths
        )
        plugin = DraPlugin(preparer, paths)
        plugin.start()
        kubelet = DraKubelet(paths.registry_dir)
        assert kubelet.register_all() == [DRIVER]
        reply = kubelet.prepare(DRIVER, [("vms", "render-vgpu", uid)]).claims[uid]
        assert reply.error == ""
        (device,) = reply.devices
        assert device.device_name == target.name
        spec = json.loads((paths.cdi_dir / f"{DRIVER}_{uid}.json").read_text())
        group = Path(host.root, "bus/pci/devices", target.key, "iommu_group").resolve().name
        assert {"path": f"/dev/vfio/{group}"} in spec["devices"][0]["containerEdits"]["deviceNodes"]
        assert f"{DRIVER}/vgpu={spec['devices'][0]['name']}" in device.cdi_device_ids

        # 5. a layout that would destroy the claimed vGPU is blocked, naming claim and pod.
        in_use = claims_in_use(KubeClaims(client), NODE)
        assert in_use == {
            target.key: "ResourceClaim vms/render-vgpu (pod vms/virt-launcher-render-x2x9z)"
        }
        smaller = (
            '    - devices: ["0000:a1:00.0"]\n      vgpu-devices: {L40S-24Q: 2}\n'
            "      publish: dra\n"
        )
        second = _reconcile(host, smaller, base, in_use).plan
        (blocked,) = [b for b in second.blocked if b.address.endswith(f"vf[{target.key}]")]
        assert blocked.holder is not None and "ResourceClaim vms/render-vgpu" in blocked.holder
        assert "virt-launcher-render-x2x9z" in blocked.holder
    finally:
        if kubelet is not None:
            kubelet.close()
        if plugin is not None:
            plugin.stop()
        host.close()
        client.close()
