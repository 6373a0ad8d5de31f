"""Every command's ``--help`` ``Examples`` work as written, as the pages' shell blocks do
(``tests/test_docs_commands.py``).

Each command's examples run in order, in one temporary directory that holds a copy of
``configs/``, ``deploy/`` and ``schemas/`` and the two files the examples name:
``layouts.yaml`` (``configs/examples/mixed-node.yaml``) and ``node.yaml`` (the
simulated node ``configs/sim/mixed.yaml``), with the virtual environment's
``vgpu-state`` first on ``PATH``. Every example must exit 0. An example that needs a
cluster runs against the suite's real kube-apiserver (``~/.kube/config``); one that
cannot run here at all is listed in :data:`NOT_RUN` with the reason, and the list may
name only examples that exist.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.test_docs_commands import REPO, Shell
from vgpu_state.cli.main import cli

GPU_HOST = "reads (or changes) the host's /sys: it needs a GPU node"
DAEMON = (
    "serves until it is stopped: tests/test_agent_e2e.py, test_deviceplugin_cli.py and "
    "test_controller_real.py run the daemons as processes"
)
FUSE = "mounts a simulated node with FUSE at /tmp/x (tests/test_sim_fuse.py mounts the same way)"

NOT_RUN: dict[str, tuple[str, str]] = {
    # kind ("skip" or "cluster"), why
    "vgpu-state COMMAND --help": (
        "skip",
        "COMMAND stands for each command: this test runs every command's --help",
    ),
    'vgpu-state agent --node "$NODE_NAME" -f /etc/vgpu-state/config.yaml --mode plan-only': (
        "skip",
        DAEMON,
    ),
    "vgpu-state agent --node gpu-node-1 --sim node.yaml -f ./layouts/config.yaml "
    "--kubeconfig ~/.kube/config --no-device-plugin": ("skip", DAEMON),
    "vgpu-state apply -f layouts.yaml": ("skip", GPU_HOST),
    "vgpu-state plan -f layouts.yaml --out plan.json && vgpu-state apply plan.json": (
        "skip",
        GPU_HOST,
    ),
    "vgpu-state apply -f layouts.yaml --auto-approve --skip-blocked -o json": ("skip", GPU_HOST),
    "vgpu-state assert -f layouts.yaml": ("skip", GPU_HOST),
    "vgpu-state assert -f layouts.yaml -o json": ("skip", GPU_HOST),
    "vgpu-state controller --kubeconfig ~/.kube/config --once": (
        "cluster",
        "one pass of the controller against the cluster",
    ),
    "vgpu-state controller --kubeconfig ~/.kube/config -f layouts.yaml": ("skip", DAEMON),
    "vgpu-state deviceplugin": ("skip", DAEMON),
    "vgpu-state deviceplugin --sim configs/sim/a2-host.yaml --fake-kubelet": ("skip", DAEMON),
    "vgpu-state deviceplugin --sysfs-root /host/sys": ("skip", DAEMON),
    "vgpu-state doctor": ("skip", GPU_HOST),
    "vgpu-state doctor -f layouts.yaml -c a2-mixed": ("skip", GPU_HOST),
    "vgpu-state doctor -o json": ("skip", GPU_HOST),
    "vgpu-state dra-remove-slices --kubeconfig ~/.kube/config": (
        "cluster",
        "removes the node's ResourceSlices",
    ),
    "vgpu-state dra-remove-slices --node gpu-node-1": (
        "cluster",
        "removes the node's ResourceSlices",
    ),
    "vgpu-state export > current.yaml": ("skip", GPU_HOST),
    "vgpu-state fleet plan -f layouts.yaml": ("cluster", "plans the cluster's nodes"),
    "vgpu-state fleet plan -f layouts.yaml --kubeconfig ~/.kube/config --context prod": (
        "skip",
        "needs a kubeconfig context named prod",
    ),
    "vgpu-state fleet plan -f layouts.yaml -o json > fleet-plan.json": (
        "cluster",
        "plans the cluster's nodes",
    ),
    'vgpu-state fleet plan -f layouts.yaml --detailed-exitcode || echo "changes: $?"': (
        "cluster",
        "plans the cluster's nodes",
    ),
    "vgpu-state fleet snapshot --out fleet.jsonl": ("cluster", "reads the cluster"),
    "vgpu-state controller --context prod -f layouts.yaml --once": (
        "skip",
        "needs a kubeconfig context named prod",
    ),
    "vgpu-state fleet snapshot --context prod --out fleet.jsonl.gz": (
        "skip",
        "needs a kubeconfig context named prod",
    ),
    "vgpu-state fleet plan -f layouts.yaml --from fleet.jsonl": (
        "cluster",
        "plans the snapshot the example before took of the cluster",
    ),
    "vgpu-state plan -f layouts.yaml": ("skip", GPU_HOST),
    "vgpu-state plan -f layouts.yaml -c a2-mixed --node gpu-7 --label pool=vdi": ("skip", GPU_HOST),
    "vgpu-state plan -f layouts.yaml -o json --out plan.json": ("skip", GPU_HOST),
    "vgpu-state plan -f layouts.yaml --kubeconfig ~/.kube/config --node gpu-7": ("skip", GPU_HOST),
    "vgpu-state scan --sysfs-root /host/sys --node gpu-7": (
        "skip",
        "reads a GPU node's sysfs mounted at /host/sys",
    ),
    "vgpu-state scan --in-use 6c1e...=vm/default/win-1 --proc-root /host/proc": (
        "skip",
        "reads a GPU node's /sys and its /proc mounted at /host/proc",
    ),
    "vgpu-state sim mount --spec configs/sim/a2-host.yaml /tmp/x --foreground": ("skip", FUSE),
    "vgpu-state sim sriov-manage --root /tmp/x -e ALL": ("skip", FUSE),
    "vgpu-state sim mount --spec configs/sim/a2-host.yaml /tmp/x --foreground &": ("skip", FUSE),
    "vgpu-state scan --sysfs-root /tmp/x": ("skip", FUSE),
    "fusermount3 -u /tmp/x": ("skip", FUSE),
    "vgpu-state sim sriov-manage --root /tmp/x -e 0000:08:00.0": ("skip", FUSE),
    "vgpu-state sim sriov-manage --root /tmp/x -d ALL": ("skip", FUSE),
    "kubectl -n vgpu-state get configmap vgpu-state-config "
    "-o jsonpath='{.data.config\\.yaml}' | vgpu-state validate -f -": (
        "cluster",
        "reads the installed ConfigMap",
    ),
}

SETUP: dict[str, list[str]] = {
    # Hidden from the reader, as a page's ``setup:`` lines: what the examples assume.
    "assert": [
        "vgpu-state apply -f configs/examples/mixed-node.yaml --sim node.yaml --auto-approve"
    ],
    "history": [
        "vgpu-state apply -f configs/examples/mixed-node.yaml --sim node.yaml --auto-approve"
    ],
}

CLUSTER_SETUP: dict[str, list[str]] = {
    # Run once the cluster is attached: what the reader's own cluster already has.
    "controller": [
        "printf 'apiVersion: kubevirt.io/v1\\nkind: KubeVirt\\nmetadata: {name: kubevirt}\\n"
        "spec: {}\\n' | kubectl create -n kubevirt -f -"
    ],
}


def _commands(cmd: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, (*path, name))


def examples(path: tuple[str, ...]) -> list[str]:
    """The ``Examples:`` of ``vgpu-state PATH --help``: one command line each (continued
    lines joined), comments left out."""
    text = CliRunner().invoke(cli, [*path, "--help"], terminal_width=1000).output
    assert "Examples:" in text, f"vgpu-state {' '.join(path)} --help shows no examples"
    block = text.split("Examples:", 1)[1].split("\n\n", 2)
    lines = (block[1] if not block[0].strip() else block[0]).splitlines()
    found: list[str] = []
    pending = ""
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        found.append(pending + line)
        pending = ""
    return found


COMMANDS = list(_commands(cli))
ALL = {example for path in COMMANDS for example in examples(path)}


def test_every_listed_example_exists() -> None:
    """No reason is kept for an example that is gone (or was reworded)."""
    assert set(NOT_RUN) <= ALL, sorted(set(NOT_RUN) - ALL)
    skipped = [e for e, (kind, _) in NOT_RUN.items() if kind == "skip"]
    print(f"\n{len(ALL)} --help examples; not run by any test:")
    for example in skipped:
        print(f"  {example}: {NOT_RUN[example][1]}")
    assert all(why for _, why in NOT_RUN.values())
    assert all(kind in ("skip", "cluster") for kind, _ in NOT_RUN.values())


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "vgpu-state")
def test_every_help_example_works_as_written(
    path: tuple[str, ...], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    shell = Shell(tmp_path)
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", tmp_path / "node.yaml")
    shutil.copy(REPO / "configs" / "examples" / "mixed-node.yaml", tmp_path / "layouts.yaml")
    for command in SETUP.get(" ".join(path), []):
        done = shell.run(command)
        assert done.returncode == 0, f"setup {command!r}: {done.stderr}"
    ran = 0
    for example in examples(path):
        kind = NOT_RUN.get(example, ("run", ""))[0]
        if kind == "skip":
            continue
        if kind == "cluster" and "KUBECONFIG" not in shell.env:
            plane = request.getfixturevalue("cluster")
            shell.use_cluster(plane.workdir / "kubeconfig")
            for command in CLUSTER_SETUP.get(" ".join(path), []):
                done = shell.run(command)
                assert done.returncode == 0, f"setup {command!r}: {done.stderr}"
        done = shell.run(example)
        assert done.returncode == 0, (
            f"vgpu-state {' '.join(path)} --help: `{example}` exited {done.returncode}\n"
            f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
        )
        ran += 1
    if not ran:
        pytest.skip("no example of this command can run here (NOT_RUN says why)")
