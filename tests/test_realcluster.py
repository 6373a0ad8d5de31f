"""The real control plane the cluster tests run against (``tests/realcluster.py``).

What it must be for the other tests to mean anything: upstream's API server
with ``deploy/`` installed, TLS, RBAC and Node authorization, and agent tokens
that carry their node as a DaemonSet pod's token does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.realcluster import NAMESPACE, ApiError, ControlPlane, kubevirt_crd
from vgpu_state.kube import crd

AGENT = f"system:serviceaccount:{NAMESPACE}:vgpu-state-agent"


def test_an_agent_token_names_the_service_account_and_the_node_of_its_pod(
    cluster: ControlPlane,
) -> None:
    token = cluster.agent_token("gpu-a")
    who = cluster.whoami(token)
    assert who["username"] == AGENT
    assert who["extra"]["authentication.kubernetes.io/node-name"] == ["gpu-a"]
    assert who["extra"]["authentication.kubernetes.io/pod-name"] == ["vgpu-state-agent-gpu-a"]


def test_the_shipped_rbac_refuses_what_it_does_not_grant(cluster: ControlPlane) -> None:
    cluster.refusals_expected = True
    token = cluster.agent_token("gpu-a")
    mark = cluster.audit_mark()

    def status(method: str, path: str) -> int:
        try:
            cluster.request(method, path, token=token)
        except ApiError as e:
            return e.status
        return 200

    assert status("GET", "/api/v1/nodes/gpu-a") == 200
    # Its own VGPUNodeState by name (a 404 here: none yet); listing them all is not granted.
    assert status("GET", "/apis/vgpu-state.io/v1alpha1/vgpunodestates/gpu-a") == 200
    assert status("GET", "/api/v1/secrets") == 403
    assert status("DELETE", "/api/v1/nodes/gpu-a") == 403
    assert status("GET", "/api/v1/namespaces/default/configmaps") == 403
    # Leases only in the agent's namespace.
    rollout = "leases/vgpu-state-rollout-0"
    assert status("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/{rollout}") == 200
    assert status("GET", f"/apis/coordination.k8s.io/v1/namespaces/default/{rollout}") == 403
    refused = [e for e in cluster.audit(mark, AGENT) if e["responseStatus"]["code"] == 403]
    assert len(refused) == 4, "the audit log records each refusal"


def test_the_crds_are_installed_and_enforce_their_schemas(cluster: ControlPlane) -> None:
    served = cluster.get(
        "apiextensions.k8s.io/v1/customresourcedefinitions", crd.crd()["metadata"]["name"]
    )
    assert served is not None
    # KubeVirt's own schema: a misspelt field is refused under strict field validation,
    # a value of the wrong type always.
    bad = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt"},
        "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": [
            {"mdevNameSelector": "NVIDIA A2-4Q", "resourceName": "nvidia.com/A2-4Q",
             "externalResourceProvide": True},
        ]}}},
    }  # fmt: skip
    with pytest.raises(ApiError) as refused:
        cluster.request(
            "POST", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts?fieldValidation=Strict", bad
        )
    assert refused.value.status == 400 and "unknown field" in str(refused.value)
    wrong_type = json.loads(
        json.dumps(bad).replace(
            '"externalResourceProvide": true', '"externalResourceProvider": "yes"'
        )
    )
    with pytest.raises(ApiError) as refused:
        cluster.request("POST", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts", wrong_type)
    assert refused.value.status == 422
    good = json.loads(json.dumps(wrong_type).replace('"yes"', "true"))
    made = cluster.request("POST", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts", good)
    assert (
        made["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"][0][
            "externalResourceProvider"
        ]
        is True
    )


def test_the_kubevirt_crd_schema_is_structural_and_complete() -> None:
    schema = kubevirt_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = json.dumps(schema)
    assert "$ref" not in text and '"description"' not in text
    config = schema["properties"]["spec"]["properties"]["configuration"]["properties"]
    assert {
        "permittedHostDevices",
        "mediatedDevicesConfiguration",
        "developerConfiguration",
    } <= set(config)


def test_the_dra_device_class_is_served_as_shipped_and_selects_by_cel(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    served = cluster.get("resource.k8s.io/v1/deviceclasses", "vgpu.vgpu-state.io")
    assert served is not None, "deploy/components/dra's DeviceClass was applied"
    assert served["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "vgpu.vgpu-state.io"'}}
    ]
    # A claim through it with the selector the DeviceClass's comment and docs/dra.md suggest.
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "l40s-12q"},
        "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
            "deviceClassName": "vgpu.vgpu-state.io",
            "selectors": [{"cel": {"expression":
                'device.attributes["vgpu.vgpu-state.io"].vgpuType == "L40S-12Q"'}}],
        }}]}},
    }  # fmt: skip
    made = cluster.request(
        "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim
    )
    assert (
        made["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "vgpu.vgpu-state.io"
    )
    cluster.request("DELETE", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/l40s-12q")


def test_a_field_the_server_drops_is_logged_as_its_warning(
    cluster: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from vgpu_state.kube.api import KubeApi

    api = KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
    cluster.ensure_node("gpu-a")
    with caplog.at_level("WARNING", logger="vgpu_state.kube.api"):
        api.patch("/api/v1/nodes/gpu-a", {"spec": {"unschedulable": False}}, "merge")
        assert not caplog.records
        api.patch("/api/v1/nodes/gpu-a", {"spec": {"unschedulabel": True}}, "merge")
    [record] = caplog.records
    assert 'unknown field "spec.unschedulabel"' in record.getMessage()
    assert "PATCH /api/v1/nodes/gpu-a" in record.getMessage()
