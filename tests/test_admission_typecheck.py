"""The shipped admission policies type-check clean on the real API server.

The server type-checks a ValidatingAdmissionPolicy's expressions against the schemas it
serves only when the policy names its groups, versions and resources (no ``"*"``); a
policy that matches every version is never checked, and an expression error in it shows
only when a request reaches it (with ``failurePolicy: Fail``, a refusal). The checker is
upstream's policy status controller, the one kube-controller-manager runs, started here
against the real kube-apiserver as ``vap-status`` (``hack/k8s/cmd/vap-status``): it writes
``status.typeChecking`` and ``status.observedGeneration``. The Helm chart installs the
same file (``scripts/sync_chart_files.py`` keeps its copy identical).
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster import REPO, ControlPlane, Unavailable, built

POLICIES = "admissionregistration.k8s.io/v1/validatingadmissionpolicies"
SHIPPED = [
    doc
    for doc in yaml.safe_load_all((REPO / "deploy" / "policies.yaml").read_text())
    if doc and doc["kind"] == "ValidatingAdmissionPolicy"
]


@pytest.fixture
def type_checker(cluster: ControlPlane, tmp_path: Path) -> Iterator[ControlPlane]:
    """The cluster with the policy status controller running against it."""
    try:
        binary = built("vap-status")
    except Unavailable as e:  # as the cluster fixture: skipped without Go, unless required
        if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
            pytest.fail(f"vap-status is required (VGPU_STATE_REQUIRE_K8S=1): {e}")
        pytest.skip(f"no vap-status: {e}")
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    log = (tmp_path / "vap-status.log").open("w")
    proc = subprocess.Popen(
        [str(binary), "-kubeconfig", str(kubeconfig)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield cluster
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _checked(cluster: ControlPlane, name: str, timeout: float = 60) -> dict[str, Any]:
    """The policy's status once the checker has seen its current generation."""
    deadline = time.monotonic() + timeout
    while True:
        policy = cluster.get(POLICIES, name)
        assert policy is not None, f"no ValidatingAdmissionPolicy {name}"
        status: dict[str, Any] = policy.get("status") or {}
        if status.get("observedGeneration") == policy["metadata"]["generation"]:
            return status
        assert time.monotonic() < deadline, f"{name}: not type-checked after {timeout} s"
        time.sleep(0.2)


def _warnings(status: dict[str, Any]) -> list[dict[str, str]]:
    return list((status.get("typeChecking") or {}).get("expressionWarnings") or [])


def test_every_shipped_policy_type_checks_without_a_warning(type_checker: ControlPlane) -> None:
    assert len(SHIPPED) >= 5
    for policy in SHIPPED:
        name = policy["metadata"]["name"]
        assert _warnings(_checked(type_checker, name)) == [], name


@pytest.mark.parametrize("policy", SHIPPED, ids=[p["metadata"]["name"] for p in SHIPPED])
def test_an_expression_error_in_a_shipped_policy_is_reported(
    type_checker: ControlPlane, policy: dict[str, Any]
) -> None:
    """The same policy with one expression naming a field its kind does not have: the server
    reports it (so the clean result above means the policy is checked, not skipped)."""
    broken = copy.deepcopy(policy)
    name = broken["metadata"]["name"] = f"broken-{policy['metadata']['name']}"
    broken["spec"]["validations"].append({"expression": "object.metadata.noSuchField == 'x'"})
    type_checker.request("POST", "/apis/" + POLICIES, broken)
    try:
        warnings = _warnings(_checked(type_checker, name))
    finally:
        type_checker.request("DELETE", f"/apis/{POLICIES}/{name}")
    index = len(broken["spec"]["validations"]) - 1
    assert [w["fieldRef"] for w in warnings] == [f"spec.validations[{index}].expression"]
    assert "undefined field 'noSuchField'" in warnings[0]["warning"]


def test_the_controllers_migration_policy_type_checks_against_kubevirts_schema(
    type_checker: ControlPlane, kubevirt_vms: ControlPlane
) -> None:
    """``vgpu-state-controller-migrations`` (shipped with the controller, deploy/controller.yaml)
    against KubeVirt's own VirtualMachineInstanceMigration schema; a field it does not have is
    reported (the check is real)."""
    (policy,) = [
        doc
        for doc in yaml.safe_load_all((REPO / "deploy" / "controller.yaml").read_text())
        if doc and doc["kind"] == "ValidatingAdmissionPolicy"
    ]
    assert _warnings(_checked(type_checker, policy["metadata"]["name"])) == []
    broken = copy.deepcopy(policy)
    name = broken["metadata"]["name"] = "broken-controller-migrations"
    broken["spec"]["validations"].append({"expression": "object.spec.noSuchField == 'x'"})
    type_checker.request("POST", "/apis/" + POLICIES, broken)
    try:
        warnings = _warnings(_checked(type_checker, name))
    finally:
        type_checker.request("DELETE", f"/apis/{POLICIES}/{name}")
    assert "undefined field 'noSuchField'" in warnings[0]["warning"]
