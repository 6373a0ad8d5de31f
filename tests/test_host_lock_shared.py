"""One host lock for every entry point: ``vgpu-state apply`` on the node waits for the agent.

Both keep their state in one directory (``/var/lib/vgpu-state`` by default,
the agent's ``--state-dir``); a second apply that waits says who holds the
lock and for how long, and a lock file that does not say (empty, or written
by something else) gets a plain sentence.

The agent talks to the harness's real kube-apiserver (``cluster``) as its
ServiceAccount, with a token bound to a Pod on its node; a request the shipped
RBAC refuses fails the test.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.realcluster import ControlPlane
from tests.test_agent_host_flags import start_agent, stop, wait_for
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.agent import agent as agent_command
from vgpu_state.cli.session import state_dir
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted
from vgpu_state.statefiles import DEFAULT_STATE_DIR, StateDir

CATALOG = default_catalog()
PACKAGE = Path(__file__).resolve().parent.parent / "vgpu_state"

# One A2-4Q; the layout wants four, and each create takes the simulated driver 1 s.
SPEC = """\
node: a2-node
faults:
  - {op: create, delay-ms: 1000}
gpus:
  - address: "0000:08:00.0"
    model: A2
    layout: mdev
    sriov: true
    vgpus:
      - {type: A2-4Q, uuid: f715f63c-0d00-4007-9c5a-b07b0c6c05de, vf: 0}
"""

LAYOUT = """\
version: v1
vgpu-configs:
  four:
    - devices: all
      vgpu-devices: {A2-4Q: 4}
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def test_the_cli_and_the_agent_default_to_one_state_directory() -> None:
    from vgpu_state.agent.assemble import AgentFlags

    # One --state-dir option (the flag table), resolved by one rule.
    (option,) = [p for p in agent_command.params if p.name == "state_dir"]
    assert option.opts == ["--state-dir"] and option.envvar == "VGPU_STATE_STATE_DIR"
    agent_state = AgentFlags(node="n", config_file=Path("c.yaml")).state
    assert state_dir(None) == agent_state == DEFAULT_STATE_DIR
    # A simulated node's files are beside its spec, for the agent as for apply --sim.
    simulated = AgentFlags(node="n", config_file=Path("c.yaml"), sim_spec="/w/node.yaml").state
    assert simulated == state_dir("/w/node.yaml") == StateDir.beside("/w/node.yaml")
    # The directory and the files are spelled once: tests/test_one_definition.py.


@pytest.mark.parametrize("content", [b"", b"held by my backup script\n", b"{}", b'{"pid": null}'])
def test_a_lock_file_that_does_not_say_who_holds_it_gets_a_plain_message(
    tmp_path: Path, content: bytes
) -> None:
    lock = tmp_path / "apply.lock"
    lock.write_bytes(content)
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another tool holds it and writes nothing of ours
    try:
        spec = Path(__file__).resolve().parent.parent / "configs" / "sim" / "a2-host.yaml"
        sim = tmp_path / "node.yaml"
        sim.write_text(spec.read_text())
        config = tmp_path / "layout.yaml"
        config.write_text(LAYOUT)
        done = cli(
            "apply", "-f", str(config), "-c", "four", "--sim", str(sim), "--auto-approve",
            "--lock-file", str(lock), "--lock-timeout", "0.3",
        )  # fmt: skip
    finally:
        os.close(fd)
    assert done.returncode == 1
    assert "is held by another process (the lock file does not say which)" in done.stderr
    assert "None" not in done.stderr, done.stderr


@pytest.mark.usefixtures("require_fuse")
def test_cli_apply_waits_for_the_agent_and_says_who_holds_the_lock(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    node = "a2-node"
    cluster.ensure_node(node, {"nvidia.com/vgpu.config": "four"})
    (tmp_path / "node.yaml").write_text(SPEC)
    config = tmp_path / "layout.yaml"
    config.write_text(LAYOUT)
    state = StateDir.at(tmp_path / "state")
    with mounted(tmp_path / "node.yaml", tmp_path / "mnt") as m:
        agent, log = start_agent(cluster, tmp_path, node, m.root, config=LAYOUT)
        try:

            def agent_holds_the_lock() -> bool:
                try:
                    record = json.loads(state.lock.read_bytes() or b"{}")
                except (OSError, ValueError):
                    return False
                return isinstance(record, dict) and record.get("pid") == agent.pid

            wait_for("the agent's apply", agent_holds_the_lock, agent, log)
            started = time.monotonic()
            done = cli(
                "apply", "-f", str(config), "-c", "four", "--sysfs-root", str(m.root),
                "--node", node, "--auto-approve", "--journal", str(state.journal),
                "--lock-file", str(state.lock), "--lock-timeout", "60",
            )  # fmt: skip
            waited = time.monotonic() - started
            after = scan(str(m.root), catalog=CATALOG).gpus[0]
        finally:
            stop(agent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"the host lock {state.lock} is held by pid {agent.pid}" in done.stderr
    assert f"(apply: vgpu-state agent --node {node}), held for" in done.stderr
    assert "waiting up to 60 s" in done.stderr
    assert waited > 0.5, "the CLI waited for the agent's creates"
    # The CLI planned after the agent was done: nothing left to do, nothing done twice.
    assert "No changes" in done.stdout, done.stdout
    assert sorted(v.type_name or "" for v in after.vgpus) == ["A2-4Q"] * 4
