"""The DRA plugin against the kubelet's own DRA manager and a real kube-apiserver.

``hack/k8s/cmd/kubelet-harness dra`` runs the Kubernetes release's DRA manager
(``pkg/kubelet/cm/dra``) and the plugin watcher of ``pkg/kubelet/pluginmanager``
on a temp registry directory, as the kubelet wires them: the watcher finds
vgpu-state's registration socket, the manager's registration handler connects
to the DRA service, ``PrepareResources`` reads the pod's ResourceClaims from the
real API server (the ``cluster`` fixture), checks the claim is reserved for the
pod, calls ``NodePrepareResources`` and records the answer, and
``GetResources`` turns it into the container's CDI device IDs, matching the
container's ``resources.claims[].request`` against the answer's request names.

The plugin runs as the agent runs it with ``--dra`` (``DraNode``): as the
agent's ServiceAccount under the shipped RBAC (``deploy/components/dra``), its
ResourceSlices written to the real server and so checked by its validation.
Nothing schedules: each test writes the allocation into the claim's status as
the scheduler would, and for a template the claim the resourceclaim controller
would generate (owner reference, ``pod-claim-name`` annotation, the pod's
``status.resourceClaimStatuses``). The kubelet's client is the test's admin
(a real kubelet's node credentials are not minted here).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubelet_harness import Harness, require_harness, running
from vgpu_state.catalog import default_catalog
from vgpu_state.dra.slices import DRIVER
from vgpu_state.testing import dra_paths

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "configs" / "sim" / "mixed.yaml"
NODE = "gpu-node-1"
NS = "vms"
T4_MDEV = "mdev-9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"
L40S_VF = "vf-0000-81-00-6"
METADATA_ROOT = "/var/run/kubernetes.io/dra-device-attributes"
RESOURCE = "/apis/resource.k8s.io/v1"


class Rig:
    """The node: a simulated host, vgpu-state's DRA side as the agent, the kubelet's code."""

    def __init__(self, cluster: Any, base: Path, kubelet: Harness, dra: Any, host: Any) -> None:
        self.cluster = cluster
        self.base = base
        self.kubelet = kubelet
        self.dra = dra
        self.host = host

    def pod(self, name: str, claims: list[dict[str, Any]], requests: list[str]) -> dict[str, Any]:
        """A VM's launcher pod on the node: the compute container asks for each request."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "nodeName": NODE,
                "automountServiceAccountToken": False,
                "resourceClaims": claims,
                "containers": [
                    {
                        "name": "compute",
                        "image": "virt-launcher",
                        "resources": {
                            "claims": [
                                {"name": r.split("/")[0], "request": r.split("/")[1]}
                                for r in requests
                            ]
                        },
                    }
                ],
            },
        }
        created: dict[str, Any] = self.cluster.request(
            "POST", f"/api/v1/namespaces/{NS}/pods", body
        )
        return created

    def claim(
        self,
        name: str,
        requests: list[dict[str, Any]],
        results: list[tuple[str, str]],
        pod: dict[str, Any],
        *,
        template_claim: str | None = None,
    ) -> dict[str, Any]:
        """Create a ResourceClaim and allocate it as the scheduler would, reserved for ``pod``."""
        meta: dict[str, Any] = {"name": name, "namespace": NS}
        if template_claim is not None:  # what the resourceclaim controller writes
            meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": template_claim}
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                 "uid": pod["metadata"]["uid"], "controller": True}
            ]  # fmt: skip
        created = self.cluster.request(
            "POST",
            f"{RESOURCE}/namespaces/{NS}/resourceclaims",
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
             "spec": {"devices": {"requests": requests}}},
        )  # fmt: skip
        status = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": NODE, "device": d}
                        for r, d in results
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [NODE]}
                        ]}
                    ]
                },
            },
            "reservedFor": [
                {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            ],
        }  # fmt: skip
        return self.cluster.request(  # type: ignore[no-any-return]
            "PUT",
            f"{RESOURCE}/namespaces/{NS}/resourceclaims/{name}/status",
            {**created, "status": status},
        )

    def prepare(self, pod: str) -> dict[str, Any]:
        return self.kubelet.ask("prepare", namespace=NS, pod=pod)

    def metadata(self, cdi_id: str) -> tuple[str, dict[str, Any]]:
        """The container path and the document of a metadata CDI device."""
        name = cdi_id.split("=", 1)[1]
        cdi = self.dra.preparer.paths.cdi_dir
        spec = json.loads((cdi / f"{DRIVER}_metadata_{name}.json").read_text())
        (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
        return mount["containerPath"], json.loads(Path(mount["hostPath"]).read_text())


@pytest.fixture
def rig(cluster: Any, tmp_path: Path) -> Iterator[Rig]:
    require_harness()
    from vgpu_state.agent.dra import DraNode
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.sim.host import SimHost

    # The agent's DRA permissions are the shipped ones (deploy/ with components/dra).
    if cluster.request("GET", f"/api/v1/namespaces/{NS}") is None:
        cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    # No controller-manager creates a namespace's default ServiceAccount.
    if cluster.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default") is None:
        cluster.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts",
                        {"metadata": {"name": "default"}})  # fmt: skip
    token = cluster.agent_token(NODE)
    agent_kubeconfig = cluster.write_kubeconfig(tmp_path / "agent.kubeconfig", token=token)

    base = Path(tempfile.mkdtemp(prefix="kdra-", dir="/tmp"))  # unix socket paths stay short
    host = SimHost(SIM)
    paths = dra_paths(base, host.root)
    api = KubeApi.connect(str(agent_kubeconfig))
    dra = DraNode(api, NODE, paths, catalog=CATALOG, resync_seconds=1.0)
    try:
        with running(
            "dra", "--kubeconfig", str(cluster.workdir / "kubeconfig"), "--node", NODE,
            "--registry-dir", str(paths.registry_dir), "--state-dir", str(base / "kubelet"),
            log=tmp_path / "kubelet.log",
        ) as kubelet:  # fmt: skip
            dra.refresh(host.scan())
            dra.start()
            kubelet.wait_for("the kubelet registers the plugin", "registered",
                             lambda a: a.get("registered") is True, driver=DRIVER)  # fmt: skip
            yield Rig(cluster, base, kubelet, dra, host)
    finally:
        dra.stop()
        api.close()
        host.close()
        for kind in ("resourceclaims", "resourceclaimtemplates"):
            cluster.request("DELETE", f"{RESOURCE}/namespaces/{NS}/{kind}")
        cluster.request("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
        shutil.rmtree(base, ignore_errors=True)


def test_the_slices_pass_the_real_servers_validation_and_name_the_node(rig: Rig) -> None:
    deadline = time.monotonic() + 30
    while True:
        items = rig.cluster.request("GET", f"{RESOURCE}/resourceslices")["items"]
        ours = [s for s in items if s["spec"]["driver"] == DRIVER]
        if ours or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    devices = {d["name"] for s in ours for d in s["spec"]["devices"]}
    assert {T4_MDEV, L40S_VF} <= devices
    assert {s["spec"]["nodeName"] for s in ours} == {NODE}


def test_a_first_available_claim_gives_the_container_its_cdi_devices(rig: Rig) -> None:
    """The request ``gpu`` is satisfied by its subrequest ``l40s``; the container asks for
    ``gpu``, as KubeVirt's launcher pod does (``requestName``)."""
    pod = rig.pod("virt-launcher-fa", [{"name": "gpu", "resourceClaimName": "fa"}], ["gpu/gpu"])
    claim = rig.claim(
        "fa",
        [{"name": "gpu", "firstAvailable": [
            {"name": "l40s", "deviceClassName": DRIVER, "selectors": [{"cel": {"expression":
             f'device.attributes["{DRIVER}"].productName == "L40S"'}}]},
            {"name": "any", "deviceClassName": DRIVER},
        ]}],
        [("gpu/l40s", L40S_VF)],
        pod,
    )  # fmt: skip
    uid = claim["metadata"]["uid"]
    got = rig.prepare("virt-launcher-fa")
    assert "error" not in got, got
    devices = got["containers"]["compute"]
    print(f"kubelet: container compute gets CDI devices {devices}")
    assert devices == [f"{DRIVER}/vgpu={uid}-{L40S_VF}", f"{DRIVER}/metadata={uid}_gpu"]
    container_path, doc = rig.metadata(devices[1])
    assert container_path == f"{METADATA_ROOT}/resourceclaims/fa/gpu/{DRIVER}-metadata.json"
    assert doc["requests"][0]["name"] == "gpu/l40s"
    # The real server keeps no generation on claims; the file's own starts at 1.
    assert "generation" not in claim["metadata"] or claim["metadata"]["generation"] == 0
    assert doc["metadata"]["generation"] == 1
    assert doc["metadata"]["uid"] == uid

    assert rig.kubelet.ask("unprepare", namespace=NS, pod="virt-launcher-fa") == {"ok": True}
    assert not any(rig.dra.preparer.paths.cdi_dir.iterdir())


def test_a_claim_from_a_template_gets_the_template_path(rig: Rig) -> None:
    rig.cluster.request(
        "POST",
        f"{RESOURCE}/namespaces/{NS}/resourceclaimtemplates",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "t4", "namespace": NS},
         "spec": {"spec": {"devices": {"requests": [
             {"name": "vgpu", "exactly": {"deviceClassName": DRIVER}}]}}}},
    )  # fmt: skip
    pod = rig.pod("virt-launcher-tm", [{"name": "vgpu", "resourceClaimTemplateName": "t4"}],
                  ["vgpu/vgpu"])  # fmt: skip
    generated = "virt-launcher-tm-vgpu-x7k2p"
    claim = rig.claim(
        generated,
        [{"name": "vgpu", "exactly": {"deviceClassName": DRIVER}}],
        [("vgpu", T4_MDEV)],
        pod,
        template_claim="vgpu",
    )
    rig.cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/virt-launcher-tm/status",
        {"status": {"resourceClaimStatuses": [{"name": "vgpu", "resourceClaimName": generated}]}},
        "application/merge-patch+json",
    )
    uid = claim["metadata"]["uid"]
    got = rig.prepare("virt-launcher-tm")
    assert "error" not in got, got
    devices = got["containers"]["compute"]
    assert devices == [f"{DRIVER}/vgpu={uid}-{T4_MDEV}", f"{DRIVER}/metadata={uid}_vgpu"]
    container_path, doc = rig.metadata(devices[1])
    assert container_path == (
        f"{METADATA_ROOT}/resourceclaimtemplates/vgpu/vgpu/{DRIVER}-metadata.json"
    )
    assert doc["podClaimName"] == "vgpu" and doc["metadata"]["generation"] == 1


def test_a_claim_reserved_for_another_pod_is_not_prepared(rig: Rig) -> None:
    """The kubelet's own check, before any call to the plugin."""
    owner = rig.pod("virt-launcher-a", [{"name": "gpu", "resourceClaimName": "shared"}],
                    ["gpu/gpu"])  # fmt: skip
    rig.pod("virt-launcher-b", [{"name": "gpu", "resourceClaimName": "shared"}], ["gpu/gpu"])
    rig.claim("shared", [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
              [("gpu", T4_MDEV)], owner)  # fmt: skip
    got = rig.prepare("virt-launcher-b")
    assert "is not allowed to use ResourceClaim shared" in got.get("error", ""), got
    assert not any(rig.dra.preparer.paths.cdi_dir.glob("*.json"))


def _our_slices(cluster: Any) -> list[str]:
    items = cluster.request("GET", f"{RESOURCE}/resourceslices")["items"]
    return sorted(s["metadata"]["name"] for s in items if s["spec"]["driver"] == DRIVER)


def _wait(what: str, check: Any, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - started


def test_slices_outlive_a_restart_and_the_kubelet_wipes_them_when_the_driver_stays_away(
    rig: Rig,
) -> None:
    """The kubelet's contract for DRA drivers, with the kubelet's own code: the agent
    keeps its slices when it stops; the kubelet cancels its wipe when the plugin comes
    back in time, and wipes the driver's slices itself 30 s after it went for good."""
    from vgpu_state.agent.dra import DraNode

    _wait("slices published", lambda: _our_slices(rig.cluster), 30)
    published = _our_slices(rig.cluster)
    paths = rig.dra.preparer.paths
    rig.dra.stop()  # a restart or a rollout: the agent goes ...
    assert _our_slices(rig.cluster) == published
    time.sleep(3)
    again = DraNode(rig.dra.publisher.api, NODE, paths, catalog=CATALOG, resync_seconds=1.0)
    again.refresh(rig.host.scan())
    again.start()  # ... and comes back within the kubelet's 30 s
    rig.dra = again
    rig.kubelet.wait_for("the plugin registered again", "registered",
                         lambda a: a.get("registered") is True, driver=DRIVER)  # fmt: skip
    time.sleep(32)
    assert _our_slices(rig.cluster) == published, "the kubelet wiped a driver that came back"

    again.stop()  # gone for good (without an uninstall)
    assert _our_slices(rig.cluster) == published
    took = _wait("the kubelet wiping the slices", lambda: not _our_slices(rig.cluster), 60)
    print(f"the kubelet wiped the driver's slices {took:.0f} s after it went")
    assert took > 20


def test_dra_remove_slices_uninstalls_the_slices_on_the_real_server(rig: Rig) -> None:
    from click.testing import CliRunner

    from vgpu_state.cli.main import cli

    _wait("slices published", lambda: _our_slices(rig.cluster), 30)
    rig.dra.stop()
    published = _our_slices(rig.cluster)
    kubeconfig = rig.cluster.workdir / "kubeconfig"
    result = CliRunner().invoke(cli, ["dra-remove-slices", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 0, result.output
    assert f"{len(published)} ResourceSlice(s) deleted; none left on every node" in result.output
    assert _our_slices(rig.cluster) == []
