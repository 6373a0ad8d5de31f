"""The Kubernetes client is loaded only by commands that talk to a cluster.

``import kubernetes`` costs about half a second (its generated API modules more
than a second); a plan against a simulated or local node must not pay for it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _imported(args: list[str]) -> set[str]:
    """Top-level packages a fresh interpreter imported while running ``args``."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "import time:" in result.stderr, result.stderr[-2000:]
    names: set[str] = set()
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        module = line.rsplit("|", 1)[1].strip()
        names.add(module.split(".")[0])
    return names


def test_a_command_without_cluster_flags_never_loads_kubernetes() -> None:
    spec = REPO / "configs" / "sim" / "mixed.yaml"
    config = REPO / "configs" / "examples" / "mixed-node.yaml"
    names = _imported(["-m", "vgpu_state.cli.main", "plan", "-f", str(config), "--sim", str(spec)])
    assert "vgpu_state" in names  # the measurement itself works
    assert "kubernetes" not in names
    assert "grpc" not in names


def test_importing_the_cluster_package_loads_no_client() -> None:
    names = _imported(
        [
            "-c",
            "import vgpu_state.kube, vgpu_state.kube.api, vgpu_state.kube.kubevirt, "
            "vgpu_state.kube.node",
        ]
    )
    assert "vgpu_state" in names
    assert "kubernetes" not in names
    assert "grpc" not in names


def test_connecting_loads_the_client() -> None:
    """The check above is not vacuous: using the adapter does import ``kubernetes``."""
    names = _imported(
        [
            "-c",
            "from vgpu_state.kube.api import KubeApi\n"
            "try:\n    KubeApi.connect('/nonexistent')\nexcept Exception:\n    pass",
        ]
    )
    assert "kubernetes" in names


def test_connecting_loads_only_the_client_parts_it_uses() -> None:
    """Not the dynamic client (jsonschema), streams (websocket), informer or leader election;
    and for the in-cluster service account not the kubeconfig loader (OAuth, YAML, requests)."""
    probe = (
        "from vgpu_state.kube.api import KubeApi\n"
        "try:\n    KubeApi.connect({kubeconfig!r}, in_cluster={in_cluster})\n"
        "except Exception as e:\n    assert 'cannot load Kubernetes credentials' in str(e), e"
    )
    heavy = {"kubernetes_validate", "jsonschema", "websocket", "referencing"}
    kubeconfig = _imported(["-c", probe.format(kubeconfig="/nonexistent", in_cluster=None)])
    assert {"kubernetes", "requests_oauthlib", "yaml"} <= kubeconfig
    assert not heavy & kubeconfig
    in_cluster = _imported(["-c", probe.format(kubeconfig=None, in_cluster=True)])
    assert "kubernetes" in in_cluster
    assert not (heavy | {"requests_oauthlib", "oauthlib", "requests", "yaml"}) & in_cluster


def test_the_kubernetes_package_is_whole_for_other_code_after_connecting() -> None:
    probe = (
        "import sys\n"
        "from vgpu_state.kube.api import KubeApi\n"
        "try:\n    KubeApi.connect('/nonexistent')\nexcept Exception:\n    pass\n"
        "assert 'kubernetes.dynamic' not in sys.modules\n"
        "import kubernetes\n"
        "from kubernetes import dynamic, config, utils\n"
        "assert kubernetes.__version__\n"
        "assert kubernetes.watch.Watch and kubernetes.stream.stream\n"
        "assert dynamic.DynamicClient and config.load_kube_config\n"
        "assert config.new_client_from_config\n"
        "assert utils.parse_quantity('1Ki') == 1024\n"
        "assert 'kubernetes.dynamic' in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
