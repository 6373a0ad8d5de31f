"""Node-scoped trust, against the real API server: an agent's token bound to a pod on node A
may write node A's own objects and nothing of node B's, nor the KubeVirt CR.

The refusals come from the shipped ``deploy/`` (RBAC and the ValidatingAdmissionPolicies
in ``deploy/policies.yaml``) as a real kube-apiserver enforces them; the token is one the
server issued for the agent's ServiceAccount, bound to a Pod on node A, so the server
itself puts ``authentication.kubernetes.io/node-name: node-a`` in it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from tests.realcluster import ApiError, ControlPlane

A, B = "node-a", "node-b"
NAMESPACE = "vgpu-state"
NODESTATES = "/apis/vgpu-state.io/v1alpha1/vgpunodestates"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
KUBEVIRT = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts"
MERGE = "application/merge-patch+json"
JSON = "application/json"


def _now(offset: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _nodestate(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "vgpu-state.io/v1alpha1",
        "kind": "VGPUNodeState",
        "metadata": {"name": node},
        "spec": {"nodeName": node},
    }


def _lease(name: str, holder: str, renewed: str, seconds: int = 120) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds, "renewTime": renewed},
    }


IN_2099 = "2099-01-01T00:00:00.000000Z"
SLOT_WRITER = "?fieldManager=vgpu-state-rollout"
"""The field manager the agent writes its slots as; the policy reads the server's time from it."""


def _slice(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "vgpu.vgpu-state.io",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


@pytest.fixture
def two_nodes(cluster: ControlPlane) -> tuple[ControlPlane, str]:
    """Nodes A and B, B with the objects an agent keeps, and a token bound to a pod on A."""
    for node in (A, B):
        cluster.ensure_node(node, {"nvidia.com/vgpu.config": "default"})
    cluster.request("POST", NODESTATES, _nodestate(B))
    cluster.request("POST", SLICES, _slice(f"{B}-slice", B))
    cluster.request("POST", LEASES, _lease("vgpu-state-rollout-1", B, _now()))
    cluster.request("POST", LEASES, _lease("vgpu-state-rollout-3", B, _now(-600)))
    cluster.request(
        "POST",
        KUBEVIRT,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt"},
            "spec": {"configuration": {}},
        },
    )
    cluster.refusals_expected = True
    return cluster, cluster.agent_token(A)


Body = Callable[[ControlPlane], Any]
Write = tuple[str, str, Body, str]
"""method, path, the body (made from a fresh read where it needs one), content type"""

STATE = "nvidia.com/vgpu.config.state"


def _fixed(body: Any) -> Body:
    return lambda cluster: body


def _node(node: str, patch: dict[str, Any]) -> Write:
    return ("PATCH", f"/api/v1/nodes/{node}", _fixed(patch), MERGE)


def _label(node: str, key: str, value: str) -> Write:
    return _node(node, {"metadata": {"labels": {key: value}}})


def _annotate(node: str) -> Write:
    return _node(node, {"metadata": {"annotations": {"vgpu-state.io/last-plan": "x"}}})


def _replaced(path: str, change: Callable[[dict[str, Any]], None]) -> Write:
    """A PUT of the object at ``path`` as read now, changed (the agent's status and Lease
    writes are PUTs carrying the resourceVersion they read)."""

    def body(cluster: ControlPlane) -> Any:
        current = dict(cluster.request("GET", path.removesuffix("/status")))
        change(current)
        return current

    return ("PUT", path, body, JSON)


def _status(node: str) -> Write:
    method, path, body, content = _replaced(
        f"{NODESTATES}/{node}/status", lambda o: o.update(status={"vgpuCount": 2})
    )

    def created_first(cluster: ControlPlane) -> Any:
        if cluster.request("GET", f"{NODESTATES}/{node}") is None:
            cluster.request("POST", NODESTATES, _nodestate(node))  # as the admin
        return body(cluster)

    return method, path, created_first, content


def _owner(node: str, owner: str) -> Write:
    """Make the Node ``owner`` the owner of ``node``'s VGPUNodeState (created first, as the
    admin, when missing): the agent moves the reference to its Node registered again."""

    def body(cluster: ControlPlane) -> Any:
        if cluster.request("GET", f"{NODESTATES}/{node}") is None:
            cluster.request("POST", NODESTATES, _nodestate(node))  # as the admin
        uid = cluster.request("GET", f"/api/v1/nodes/{owner}")["metadata"]["uid"]
        ref = {"apiVersion": "v1", "kind": "Node", "name": owner, "uid": uid}
        return {"metadata": {"ownerReferences": [ref]}}

    return ("PATCH", f"{NODESTATES}/{node}", body, MERGE)


def _take(lease: str, holder: str, renewed: str | None = None) -> Write:
    """A PUT of the slot in ``holder``'s name, renewed now (or at ``renewed``), written as
    the agent writes it."""

    def body(cluster: ControlPlane) -> Any:
        current = dict(cluster.request("GET", f"{LEASES}/{lease}"))
        current["spec"].update(holderIdentity=holder, renewTime=renewed or _now())
        return current

    return ("PUT", f"{LEASES}/{lease}{SLOT_WRITER}", body, JSON)


def _create(path: str, body: dict[str, Any]) -> Write:
    return ("POST", path, _fixed(body), JSON)


# Every write of "any agent can write every node": (what, node B's or the CR's, node A's own).
WRITES: list[tuple[str, Write, Write | None]] = [
    ("the Node's state label", _label(B, STATE, "success"), _label(A, STATE, "success")),
    ("the Node's vgpu-state annotations", _annotate(B), _annotate(A)),
    # Not even on its own Node: the operator picks the layout, and taints are not ours.
    ("the Node's layout label", _label(B, "nvidia.com/vgpu.config", "evil"), None),
    ("its own Node's layout label", _label(A, "nvidia.com/vgpu.config", "evil"), None),
    # Promotion is the operator's: a node cannot put itself into enforce mode.
    ("its own Node's mode label", _label(A, "vgpu-state.io/mode", "enforce"), None),
    (
        "the Node's taints",
        _node(B, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
        None,
    ),
    ("its own Node's spec", _node(A, {"spec": {"unschedulable": True}}), None),
    ("the VGPUNodeState", _create(NODESTATES, _nodestate(B)), _create(NODESTATES, _nodestate(A))),
    ("the VGPUNodeState status", _status(B), _status(A)),
    ("the VGPUNodeState's owner", _owner(B, B), _owner(A, A)),
    ("its own VGPUNodeState owned by another Node", _owner(A, B), _owner(A, A)),
    (
        "a rollout Lease a live node holds",
        _take("vgpu-state-rollout-1", A),
        _create(LEASES, _lease("vgpu-state-rollout-0", A, _now())),
    ),
    (
        "a rollout Lease in another node's name",
        _create(LEASES, _lease("vgpu-state-rollout-2", B, _now())),
        _take("vgpu-state-rollout-3", A),  # B's expired ten minutes ago: free to take
    ),
    ("the controller's Lease", _create(LEASES, _lease("vgpu-state-controller", A, _now())), None),
    # Slots 0..63 only, for at most 600 s, dated no later than the server's time (+60 s).
    ("a slot beyond 63", _create(LEASES, _lease("vgpu-state-rollout-64", A, _now())), None),
    ("a slot 999", _create(LEASES, _lease("vgpu-state-rollout-999", A, _now())), None),
    ("a Lease named like a slot", _create(LEASES, _lease("vgpu-state-rollout-x", A, _now())), None),
    (
        "a slot lasting an hour",
        _create(LEASES, _lease("vgpu-state-rollout-0", A, _now(), seconds=3600)),
        None,
    ),
    ("a slot dated 2099", _create(LEASES, _lease("vgpu-state-rollout-0", A, IN_2099)), None),
    (
        "its own slot renewed into 2099",
        _take("vgpu-state-rollout-0", A, IN_2099),
        _create(LEASES, _lease("vgpu-state-rollout-0", A, _now())),
    ),
    (
        "its own slot deleted",  # a slot is released, never deleted
        ("DELETE", f"{LEASES}/vgpu-state-rollout-0", _fixed(None), JSON),
        _create(LEASES, _lease("vgpu-state-rollout-0", A, _now())),
    ),
    (
        "its own slot renewed without the field manager",  # no server time to check it by
        ("PUT", f"{LEASES}/vgpu-state-rollout-0", _take("vgpu-state-rollout-0", A)[2], JSON),
        _create(LEASES, _lease("vgpu-state-rollout-0", A, _now())),
    ),
    (
        "a ResourceSlice",
        ("DELETE", f"{SLICES}/{B}-slice", _fixed(None), JSON),
        _create(SLICES, _slice(f"{A}-slice", A)),
    ),
    (
        "the KubeVirt CR",  # the controller writes it, never an agent
        ("PATCH", f"{KUBEVIRT}/kubevirt", _fixed({"metadata": {"annotations": {"x": "y"}}}), MERGE),
        None,
    ),
]


@pytest.mark.parametrize(("what", "theirs", "own"), WRITES, ids=[w[0] for w in WRITES])
def test_a_token_bound_to_node_a_writes_only_node_as_objects(
    two_nodes: tuple[ControlPlane, str], what: str, theirs: Write, own: Write | None
) -> None:
    cluster, token = two_nodes
    if own is not None:
        method, path, body, content = own
        cluster.request(method, path, body(cluster), content, token=token)
    method, path, body, content = theirs
    with pytest.raises(ApiError) as refused:
        cluster.request(method, path, body(cluster), content, token=token)
    # Refused by the shipped RBAC (403) or by a policy of deploy/policies.yaml, not by chance.
    assert refused.value.status == 403 or "ValidatingAdmissionPolicy" in str(refused.value), (
        refused.value
    )


def test_a_token_without_a_node_name_is_refused(two_nodes: tuple[ControlPlane, str]) -> None:
    """The agent's ServiceAccount with a token bound to no pod: its requests carry no node."""
    cluster, _ = two_nodes
    unbound = cluster.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/vgpu-state-agent/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )["status"]["token"]
    with pytest.raises(ApiError, match="carries no node name"):
        cluster.request("POST", NODESTATES, _nodestate(A), JSON, token=unbound)


CLAIMS = "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims"


def test_an_agent_token_reads_resource_claims_and_changes_none(
    two_nodes: tuple[ControlPlane, str],
) -> None:
    """The DRA component's RBAC: the agent reads a claim by name (the kubelet's prepare) and
    lists claims (those allocated in its pool hold vGPUs); it cannot watch them, nor create,
    change, delete or set the status of any (docs/security.md says why the list stays)."""
    cluster, token = two_nodes
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "their-gpu"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.vgpu-state.io"}}]
            }
        },
    }
    stored = cluster.request("POST", CLAIMS, claim)
    assert cluster.request("GET", f"{CLAIMS}/their-gpu", token=token)["metadata"]["uid"]
    assert cluster.request("GET", "/apis/resource.k8s.io/v1/resourceclaims", token=token)["items"]
    status = {**stored, "status": {"reservedFor": [{"resource": "pods", "name": "x", "uid": "1"}]}}
    writes = [
        ("GET", "/apis/resource.k8s.io/v1/resourceclaims?watch=1&timeoutSeconds=1", None),
        ("GET", f"{CLAIMS}?watch=1&timeoutSeconds=1", None),
        ("POST", CLAIMS, {**claim, "metadata": {"name": "mine"}}),
        ("PUT", f"{CLAIMS}/their-gpu", stored),
        ("PUT", f"{CLAIMS}/their-gpu/status", status),
        ("DELETE", f"{CLAIMS}/their-gpu", None),
    ]
    for method, path, body in writes:
        with pytest.raises(ApiError) as refused:
            cluster.request(method, path, body, token=token)
        assert refused.value.status == 403, (method, path, refused.value)
