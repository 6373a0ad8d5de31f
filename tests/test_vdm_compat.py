"""A drop-in for NVIDIA vgpu-device-manager users: their config files, flags and labels as
they are (docs/deploy.md, "Compatibility with vgpu-device-manager": one test per row that
can be tested).

The CLI tests run the real command on a simulated node; the agent tests run the agent in
process against the real kube-apiserver (``cluster`` fixture), as its pod-bound
ServiceAccount under the shipped RBAC.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.apiserver import EVENTS, NODES, NODESTATES
from tests.realcluster import ControlPlane
from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
T4_LAYOUTS = REPO / "configs" / "examples" / "vdm-t4.yaml"
ONE_T4 = REPO / "configs" / "sim" / "t4-single.yaml"
STATE_LABEL = "nvidia.com/vgpu.config.state"
CONFIG_LABEL = "nvidia.com/vgpu.config"


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def one_t4(tmp_path: Path) -> Path:
    node = tmp_path / "t4-single.yaml"
    shutil.copy(ONE_T4, node)
    return node


def plan(node: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    state = str(node.parent / "state")
    return run("plan", "-f", str(T4_LAYOUTS), "--sim", str(node), "--state-dir", state, *args,
               env=env)  # fmt: skip


# --- config features: entries for GPUs the node lacks ------------------------------------


def test_t4_small_on_a_one_gpu_node_applies_entry_0_and_skips_entry_1(one_t4: Path) -> None:
    code, out, err = plan(one_t4, "-c", "T4-small")
    assert code == 0, err
    assert "entry [1] of T4-small: no GPU 1 on this node, skipped" in out
    assert "16 to create" in out and "T4-1Q" in out and "T4-2Q" not in out
    code, _, err = plan(one_t4, "-c", "T4-small", "--detailed-exitcode")
    assert code == 2, err


def test_plan_json_lists_the_skipped_entry(one_t4: Path) -> None:
    code, out, err = plan(one_t4, "-c", "T4-small", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    [skipped] = doc["skipped"]
    assert skipped["config"] == "T4-small" and skipped["index"] == 1
    assert skipped["reason"] == "no GPU 1 on this node"
    assert skipped["message"] == "entry [1] of T4-small: no GPU 1 on this node, skipped"
    assert skipped["entry"].endswith("(vgpu-configs.T4-small[1])")
    assert doc["summary"]["create"] == 16


def test_strict_makes_a_skipped_entry_an_error_naming_it(one_t4: Path) -> None:
    before = one_t4.read_text()
    code, _, err = plan(one_t4, "-c", "T4-small", "--strict")
    assert code == 1
    assert f"{T4_LAYOUTS}:" in err
    assert "entry [1] of T4-small: no GPU 1 on this node (--strict" in err
    assert "(vgpu-configs.T4-small[1])" in err
    code, _, err = run("apply", "-f", str(T4_LAYOUTS), "-c", "T4-small", "--sim", str(one_t4),
                       "--state-dir", str(one_t4.parent / "state"), "--strict",
                       "--auto-approve")  # fmt: skip
    assert code == 1 and "no GPU 1 on this node" in err
    assert one_t4.read_text() == before


def test_policy_missing_gpus_error_makes_it_an_error_too(one_t4: Path, tmp_path: Path) -> None:
    layouts = tmp_path / "strict.yaml"
    text = T4_LAYOUTS.read_text().replace(
        "version: v1\n", "version: v1\npolicy: {missing-gpus: error}\n"
    )
    layouts.write_text(text)
    code, _, err = run("plan", "-f", str(layouts), "-c", "T4-small", "--sim", str(one_t4),
                       "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert code == 1
    assert "entry [1] of T4-small: no GPU 1 on this node (policy missing-gpus: error" in err


def test_policy_missing_gpus_takes_only_skip_or_error(tmp_path: Path) -> None:
    layouts = tmp_path / "bad.yaml"
    layouts.write_text(
        "version: v1\npolicy: {missing-gpus: warn}\nvgpu-configs:\n"
        "  c:\n    - devices: all\n      vgpu-devices: {T4-4Q: 4}\n"
    )
    code, _, err = run("validate", "-f", str(layouts))
    assert code == 1
    assert (
        f"{layouts}:2:24: missing-gpus must be one of skip, error, found 'warn' "
        "(policy.missing-gpus)" in err
    )


def test_a_device_filter_matching_no_gpu_is_skipped(one_t4: Path) -> None:
    code, out, err = plan(one_t4, "-c", "T4-or-A10")
    assert code == 0, err
    assert "entry [1] of T4-or-A10: device-filter 0x223610DE matches no GPU on this node, " \
        "skipped" in out  # fmt: skip
    assert "T4-8Q" in out


def test_indices_whose_gpus_the_device_filter_does_not_match_are_skipped(
    tmp_path: Path,
) -> None:
    """GPU 0 of the mixed node is an A2: an L40S filter on ``devices: [0]`` selects none."""
    node = tmp_path / "mixed.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", node)
    layouts = tmp_path / "c.yaml"
    layouts.write_text(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: [0]\n"
        '      device-filter: "0x26B910DE"\n      vgpu-devices: {L40S-8Q: 6}\n'
    )
    code, out, err = run("plan", "-f", str(layouts), "-c", "c", "--sim", str(node),
                         "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert code == 0, err
    assert "entry [0] of c: device-filter 0x26B910DE matches none of GPU 0 on this node, " \
        "skipped" in out  # fmt: skip


def test_devices_all_lays_out_every_gpu(one_t4: Path) -> None:
    code, out, err = plan(one_t4, "-c", "T4-2Q", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["skipped"] == []
    assert doc["summary"]["create"] == 8


def test_an_entry_that_selects_a_gpu_but_cannot_lay_it_out_stays_an_error(
    one_t4: Path, tmp_path: Path
) -> None:
    layouts = tmp_path / "wrong-model.yaml"
    layouts.write_text(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: [0]\n      vgpu-devices: {A2-4Q: 4}\n"
    )
    code, _, err = run("plan", "-f", str(layouts), "-c", "c", "--sim", str(one_t4),
                       "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert code == 1
    assert "does not offer A2-4Q" in err


# --- default config: --default-config and DEFAULT_VGPU_CONFIG ----------------------------


def test_an_unlabelled_node_gets_the_default_config_flag(one_t4: Path) -> None:
    code, out, err = plan(one_t4, "--default-config", "T4-2Q")
    assert code == 0, err
    assert 'configuration "T4-2Q" (selected by --default-config' in out


def test_default_vgpu_config_in_the_environment_is_honoured(one_t4: Path) -> None:
    code, out, err = plan(one_t4, "-o", "json", env={"DEFAULT_VGPU_CONFIG": "T4-2Q"})
    assert code == 0, err
    assert json.loads(out)["selection"] == {"config": "T4-2Q", "source": "default-config"}


def test_the_label_and_the_files_default_come_first(one_t4: Path, tmp_path: Path) -> None:
    code, out, _ = plan(one_t4, "--label", f"{CONFIG_LABEL}=T4-small", "--default-config",
                        "T4-2Q", "-o", "json")  # fmt: skip
    assert code == 0
    assert json.loads(out)["selection"] == {"config": "T4-small", "source": "label"}
    with_default = tmp_path / "with-default.yaml"
    with_default.write_text(
        T4_LAYOUTS.read_text().replace("version: v1\n", "version: v1\ndefault: T4-split\n")
    )
    code, out, _ = run("select", "-f", str(with_default), "--sim", str(one_t4),
                       "--default-config", "T4-2Q", "-o", "json")  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert (doc["config"], doc["rule"]) == ("T4-split", "default")


def test_select_says_which_rule_chose(one_t4: Path) -> None:
    code, out, err = run("select", "-f", str(T4_LAYOUTS), "--sim", str(one_t4),
                         "--default-config", "T4-small", "-o", "json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["config"], doc["rule"]) == ("T4-small", "default-config")
    assert [s["message"] for s in doc["skipped"]] == [
        "entry [1] of T4-small: no GPU 1 on this node, skipped"
    ]
    code, out, err = run("select", "-f", str(T4_LAYOUTS), "--sim", str(one_t4),
                         "--default-config", "T4-small")  # fmt: skip
    assert code == 0, err
    assert "config T4-small from no label nvidia.com/vgpu.config" in out
    assert "--default-config T4-small" in out
    assert "entry [1] of T4-small: no GPU 1 on this node, skipped" in out


def test_a_default_config_the_file_lacks_is_an_error_naming_it(one_t4: Path) -> None:
    code, _, err = plan(one_t4, "--default-config", "T4-smal")
    assert code == 1
    assert "--default-config T4-smal names no config in" in err
    assert "did you mean T4-small?" in err
    code, _, err = run("select", "-f", str(T4_LAYOUTS), "--sim", str(one_t4),
                       "--default-config", "nope")  # fmt: skip
    assert code == 1 and "--default-config nope names no config" in err
    missing = str(one_t4.parent / "none")
    code, _, err = run("fleet", "plan", "-f", str(T4_LAYOUTS), "--from", missing,
                       "--default-config", "T4-smal")  # fmt: skip
    assert code == 1 and "--default-config T4-smal names no config" in err


def test_without_a_default_config_an_unlabelled_node_is_left_alone(one_t4: Path) -> None:
    code, _, err = plan(one_t4)
    assert code == 1
    assert "no config selected for node t4-single" in err
    assert "--default-config NAME" in err


# --- the agent on the real API server ----------------------------------------------------


@contextmanager
def agent_on(
    cluster: ControlPlane, tmp_path: Path, node: str, layouts: str, **flags: Any
) -> Iterator[Path]:
    """An enforcing agent for ``node`` (a simulated one-T4 node) until the block ends; yields
    the simulated node's spec (saved when the agent stops)."""
    from vgpu_state.agent.assemble import AgentFlags, build

    spec = tmp_path / "node.yaml"
    spec.write_text(ONE_T4.read_text().replace("node: t4-single", f"node: {node}"))
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.yaml").write_text(layouts)
    token = cluster.agent_token(node)
    agent = build(
        AgentFlags(
            node=node,
            config_file=config / "config.yaml",
            mode=flags.pop("mode", "enforce"),
            resync=300.0,
            listen="",
            kubeconfig=str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)),
            sim_spec=str(spec),
            state_dir=tmp_path / "state",
            device_plugin=False,
            manage_kubevirt=False,
            **flags,
        )
    )
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield spec
    finally:
        agent.stop()
        thread.join(30)


def wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def labels_of(cluster: ControlPlane, node: str) -> dict[str, str]:
    return dict(((cluster.get(NODES, node) or {}).get("metadata") or {}).get("labels") or {})


def test_the_agent_with_default_config_converges_an_unlabelled_node(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    node = "t4-default-1"
    cluster.ensure_node(node, {})
    with agent_on(cluster, tmp_path, node, T4_LAYOUTS.read_text(), default_config="default"):
        wait_for(
            "state label success", lambda: labels_of(cluster, node).get(STATE_LABEL) == "success"
        )
    assert CONFIG_LABEL not in labels_of(cluster, node)  # the agent never writes it
    status = (cluster.get(NODESTATES, node) or {})["status"]
    assert status["selectedConfig"]["name"] == "default" and status["state"] == "success"
    assert status["selectedConfig"]["source"] == "default"
    assert "--default-config default" in status["selectedConfig"]["reason"]
    assert status["vgpuCount"] == 4  # the document's default config: T4-4Q: 4
    assert "T4-4Q" in spec_text(tmp_path)


def spec_text(tmp_path: Path) -> str:
    return (tmp_path / "node.yaml").read_text()


def test_the_agent_without_default_config_leaves_an_unlabelled_node_alone_and_says_so(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    node = "t4-nodefault-1"
    cluster.ensure_node(node, {STATE_LABEL: "success"})
    with agent_on(cluster, tmp_path, node, T4_LAYOUTS.read_text()):
        status = wait_for(
            "a status",
            lambda: (cluster.get(NODESTATES, node) or {}).get("status", {}).get("conditions"),
        )
        wait_for("no state label", lambda: STATE_LABEL not in labels_of(cluster, node))
    ready = next(c for c in status if c["type"] == "Ready")
    assert ready["reason"] == "NoConfigSelected"
    assert "--default-config NAME" in ready["message"]
    assert "T4-" not in spec_text(tmp_path)  # no vGPU created


def test_the_agent_reports_skipped_entries_in_its_status_and_an_event(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    node = "t4-small-1"
    cluster.ensure_node(node, {CONFIG_LABEL: "T4-small"})
    with agent_on(cluster, tmp_path, node, T4_LAYOUTS.read_text()):
        wait_for(
            "state label success", lambda: labels_of(cluster, node).get(STATE_LABEL) == "success"
        )
        events = wait_for(
            "an EntriesSkipped Event",
            lambda: [e for e in cluster.list(EVENTS) if e.get("reason") == "EntriesSkipped"],
        )
    assert "entry [1] of T4-small: no GPU 1 on this node, skipped" in events[0]["message"]
    status = (cluster.get(NODESTATES, node) or {})["status"]
    synced = next(c for c in status["conditions"] if c["type"] == "Synced")
    assert "entry [1] of T4-small: no GPU 1 on this node, skipped" in synced["message"]
    assert status["vgpuCount"] == 16


def test_the_agent_with_strict_fails_the_node_naming_the_entry(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    node = "t4-strict-1"
    cluster.ensure_node(node, {CONFIG_LABEL: "T4-small"})
    with agent_on(cluster, tmp_path, node, T4_LAYOUTS.read_text(), strict=True):
        wait_for(
            "state label failed", lambda: labels_of(cluster, node).get(STATE_LABEL) == "failed"
        )
    status = (cluster.get(NODESTATES, node) or {})["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "entry [1] of T4-small: no GPU 1 on this node (--strict" in ready["message"]


def test_a_plan_only_agent_reports_pending_for_the_default_config(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    node = "t4-pending-1"
    cluster.ensure_node(node, {})
    layouts = T4_LAYOUTS.read_text()
    with agent_on(cluster, tmp_path, node, layouts, default_config="default", mode="plan-only"):
        wait_for(
            "state label pending", lambda: labels_of(cluster, node).get(STATE_LABEL) == "pending"
        )
    assert "T4-" not in spec_text(tmp_path)  # plan-only: nothing created


# --- fleet plan: the same rules, from what each agent reported ---------------------------


def test_fleet_plan_takes_the_default_config_and_strict(one_t4: Path) -> None:
    """``fleet plan --default-config``/``--strict`` plan a reported node as its agent would."""
    import datetime

    from vgpu_state.catalog import default_catalog
    from vgpu_state.config import load_text
    from vgpu_state.model.fleet import ReportedNode
    from vgpu_state.reconcile import Settings
    from vgpu_state.reconcile.fleet import NodeOutcome, plan_node
    from vgpu_state.sim.host import SimHost

    catalog = default_catalog()
    document = load_text(T4_LAYOUTS.read_text(), str(T4_LAYOUTS), catalog=catalog)
    now = datetime.datetime(2026, 11, 28, tzinfo=datetime.UTC)
    snapshot = SimHost(one_t4, in_memory=True).scan()
    node = ReportedNode("t4-single", {}, snapshot, scanned_at=now)
    unselected = plan_node(document, node, Settings(catalog=catalog), now)
    assert unselected.outcome is NodeOutcome.ERROR and unselected.reason == "NoConfigSelected"
    planned = plan_node(document, node, Settings(catalog=catalog, default_config="T4-small"), now)
    assert planned.outcome is NodeOutcome.CHANGES and planned.plan is not None
    assert planned.plan.selection.source == "default-config"
    assert [e.message for e in planned.plan.skipped] == [
        "entry [1] of T4-small: no GPU 1 on this node, skipped"
    ]
    strict = Settings(catalog=catalog, default_config="T4-small", strict=True)
    failed = plan_node(document, node, strict, now)
    assert failed.outcome is NodeOutcome.ERROR
    assert "entry [1] of T4-small: no GPU 1 on this node (--strict" in (failed.message or "")
