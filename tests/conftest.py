"""Shared fixtures. Keep each fixture generic and named after what it provides."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SIM_SPECS_DIR = REPO_ROOT / "configs" / "sim"


@pytest.fixture
def sim_spec_paths() -> list[Path]:
    """Every example simulator spec under ``configs/sim``."""
    return sorted(SIM_SPECS_DIR.glob("*.yaml"))


@pytest.fixture
def require_fuse() -> None:
    """Skip (printing why) when FUSE is unusable; fail instead under VGPU_STATE_REQUIRE_FUSE=1."""
    from vgpu_state.sim.fuse import fuse_unavailable_reason

    reason = fuse_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("VGPU_STATE_REQUIRE_FUSE") == "1":
        pytest.fail(f"FUSE is required (VGPU_STATE_REQUIRE_FUSE=1) but unusable: {reason}")
    print(f"skipping FUSE test: {reason}")
    pytest.skip(f"FUSE unusable: {reason}")


@pytest.fixture
def sim_host_factory(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Build ``SimHost`` objects (from a spec or a spec path); all are closed after the test."""
    from vgpu_state.sim.host import SimHost

    made: list[SimHost] = []

    def make(spec: object, root: Path | None = None) -> SimHost:
        host = SimHost(spec, root)  # type: ignore[arg-type]
        made.append(host)
        return host

    yield make
    for host in made:
        host.close()


@pytest.fixture
def fast_tmp_path(tmp_path: Path) -> Iterator[Path]:
    """An empty directory in memory (``/dev/shm`` when available) for trees of many files."""
    import shutil
    import tempfile

    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="vgpu-test-", dir=shm))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def apiserver() -> Iterator[object]:
    """A Kubernetes API server (kmock's emulator, extended: see ``tests/apiserver.py``).

    Real HTTP on 127.0.0.1 in a thread; the official ``kubernetes`` client talks
    to it. It validates every KubeVirt CR written against KubeVirt's OpenAPI
    schema, and the test fails if any write was refused as invalid.
    """
    from tests.apiserver import running_apiserver

    for api in running_apiserver():
        yield api
        assert not api.rejected, f"the API server refused invalid writes: {api.rejected}"


@pytest.fixture
def kube() -> Iterator[object]:
    """A Kubernetes API emulator (kmock, real HTTP) with resource versions, in a thread."""
    from tests.kube_emulator import RunningEmulator

    running = RunningEmulator().start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def control_plane_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real etcd + kube-apiserver for the whole run (see ``tests/realcluster.py``).

    Started by the first test that asks for it, with ``deploy/`` and the KubeVirt
    CRD installed. Without Go (nothing to build the binaries with) the tests that
    need it are skipped, saying why; VGPU_STATE_REQUIRE_K8S=1 fails them instead.
    """
    from tests.realcluster import ControlPlane, Unavailable

    plane = ControlPlane(tmp_path_factory.mktemp("k8s"))
    try:
        plane.start()
        plane.install()
    except Unavailable as e:
        plane.stop()
        if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
            pytest.fail(f"a real control plane is required (VGPU_STATE_REQUIRE_K8S=1): {e}")
        pytest.skip(f"no real control plane: {e}")
    except BaseException:
        plane.stop()
        raise
    print(f"kube-apiserver ready in {plane.startup_seconds:.1f} s")
    yield plane
    plane.stop()


@pytest.fixture
def cluster(control_plane_session: object) -> Iterator[object]:
    """The real control plane (admin client, agent tokens); what a test created is deleted after it.

    A request of any ServiceAccount (the agent's token) the server refused with 403
    fails the test, even when the product carried on: the shipped RBAC must allow
    everything the agent does. A test that provokes refusals sets
    ``cluster.refusals_expected = True``.
    """
    yield from _per_test(control_plane_session)


@pytest.fixture
def real_cluster(control_plane_session: object) -> Iterator[object]:
    """:func:`cluster` under another name, for modules whose own ``cluster`` fixture wraps it."""
    yield from _per_test(control_plane_session)


@pytest.fixture
def fleet_reader_kubeconfig(cluster: object, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig with a token of the read-only ServiceAccount that
    ``examples/gitops/fleet-reader.yaml`` ships (get and list on Nodes and
    VGPUNodeStates, nothing else), the file applied as a user would; removed after the test."""
    from tests.realcluster import FLEET_READER_SA, FLEET_READER_USER, NAMESPACE, ControlPlane

    assert isinstance(cluster, ControlPlane)
    rbac = REPO_ROOT / "examples" / "gitops" / "fleet-reader.yaml"
    cluster.kubectl("apply", "--server-side", "-f", str(rbac))
    try:
        answer = cluster.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{FLEET_READER_SA}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        token = str(answer["status"]["token"])
        assert cluster.whoami(token)["username"] == FLEET_READER_USER
        yield cluster.write_kubeconfig(tmp_path / "fleet-reader-kubeconfig", token=token)
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", str(rbac))


@pytest.fixture
def kubevirt_vms(cluster: object) -> object:
    """:func:`cluster` with KubeVirt's VirtualMachine, VirtualMachineInstance and
    VirtualMachineInstanceMigration CRDs installed (schemas from KubeVirt's own OpenAPI,
    ``hack/kubevirt/fetch.sh``). Without that document the test is skipped, saying why;
    VGPU_STATE_REQUIRE_K8S=1 fails it instead."""
    from tests.realcluster import ControlPlane, Unavailable

    assert isinstance(cluster, ControlPlane)
    try:
        cluster.install_kubevirt_vms()
    except Unavailable as e:
        if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
            pytest.fail(f"KubeVirt's CRDs are required (VGPU_STATE_REQUIRE_K8S=1): {e}")
        pytest.skip(str(e))
    return cluster


def _per_test(plane: object) -> Iterator[object]:
    from tests.realcluster import ControlPlane

    assert isinstance(plane, ControlPlane)
    mark = plane.test_mark = plane.audit_mark()
    plane.refusals_expected = False
    yield plane
    refused = [
        f"{e['verb']} {e['requestURI']} by {e['user']['username']}"
        for e in plane.audit(mark, "system:serviceaccount:")
        if e.get("responseStatus", {}).get("code") == 403
    ]
    plane.reset()
    if refused and not plane.refusals_expected:
        pytest.fail(f"the API server refused a ServiceAccount's requests (RBAC): {refused}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """At the very end of a run: how many tests were skipped, and why (grouped)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.section("skipped tests")
    terminalreporter.write_line(f"{len(skipped)} test(s) skipped:")
    for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"  {count} × {reason}")
    if any("FUSE" in reason for reason in reasons):
        terminalreporter.write_line(
            "  The FUSE tests need /dev/fuse and Debian's fuse3 (fusermount3); `make test` "
            "installs fuse3 when run as root. VGPU_STATE_REQUIRE_FUSE=1 makes them fail instead."
        )
    if any("no kubelet harness" in reason for reason in reasons):
        terminalreporter.write_line(
            "  The kubelet tests build the kubelet's device and DRA managers with Go "
            "(hack/k8s/build.sh kubelet-harness). VGPU_STATE_REQUIRE_K8S=1 makes them fail "
            "instead."
        )
    if any(reason.startswith("no image") for reason in reasons):
        terminalreporter.write_line(
            "  The image test runs the agent of the image `make image` builds (as root: "
            "buildah, debootstrap, umoci). VGPU_STATE_REQUIRE_IMAGE=1 makes it fail instead."
        )
    if any(reason.startswith("no helm") for reason in reasons):
        terminalreporter.write_line(
            "  The Helm chart tests run helm built with Go (hack/helm/build.sh, which `make "
            "test` runs when Go is there). VGPU_STATE_REQUIRE_K8S=1 makes them fail instead."
        )
    if any(reason.startswith("no actionlint") for reason in reasons):
        terminalreporter.write_line(
            "  The release workflow's lint runs actionlint built with Go "
            "(hack/actionlint/build.sh, which `make test` runs when Go is there). "
            "VGPU_STATE_REQUIRE_K8S=1 makes it fail instead."
        )
    if any(reason.startswith("no KubeVirt OpenAPI") for reason in reasons):
        terminalreporter.write_line(
            "  The evacuation tests build KubeVirt's VM, VMI and migration CRDs from its "
            "OpenAPI document (hack/kubevirt/fetch.sh, which `make test` runs). "
            "VGPU_STATE_REQUIRE_K8S=1 makes them fail instead."
        )
    if any(reason.startswith("no promtool") for reason in reasons):
        terminalreporter.write_line(
            "  The monitoring tests run Prometheus's promtool, Debian's or built with Go "
            "(hack/promtool/build.sh, which `make test` runs). "
            "VGPU_STATE_REQUIRE_K8S=1 makes them fail instead."
        )
    if any("no real control plane" in reason for reason in reasons):
        terminalreporter.write_line(
            "  The real-cluster tests build kube-apiserver, etcd and kube-controller-manager "
            "with Go (hack/k8s/build.sh, Go >= 1.26 from go.dev or the Go module proxy). "
            "VGPU_STATE_REQUIRE_K8S=1 makes them fail instead."
        )
