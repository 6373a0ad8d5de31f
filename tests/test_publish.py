"""``publish: device-plugin | dra``: where each vGPU is offered, and never through both."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import dump, load_text, resolve
from vgpu_state.dra.slices import build_pool
from vgpu_state.model.errors import ConfigError
from vgpu_state.model.policy import Publish
from vgpu_state.model.publish import split
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.render import render_text
from vgpu_state.sim.host import SimHost

CATALOG = default_catalog()

MIXED = Path(__file__).resolve().parent.parent / "configs" / "sim" / "mixed.yaml"

CONFIG = """version: v1
policy: {publish: dra}
vgpu-configs:
  top:
    - devices: ["0000:08:00.0"]
      vgpu-devices: {A2-4C: 1, A2-4Q: 1}
  mixed:
    policy: {publish: device-plugin}
    entries:
      - devices: ["0000:08:00.0"]
        vgpu-devices: {A2-4C: 1, A2-4Q: 1}
      - devices: ["0000:3b:00.0"]
        vgpu-devices: {T4-8C: 1}
        publish: dra
"""


@pytest.fixture(scope="module")
def mixed() -> NodeSnapshot:
    with SimHost(MIXED, in_memory=True) as host:
        return host.scan()


def test_entry_then_config_then_top_level_then_the_default(mixed: NodeSnapshot) -> None:
    doc = load_text(CONFIG, "c.yaml", catalog=CATALOG)
    top = resolve(doc, "top", mixed.gpus, "n", "flag", catalog=CATALOG)
    assert top.policy.publish is Publish.DRA
    assert [g.publish for g in top.gpus] == [Publish.DRA]
    assert top.publish_for("0000:81:00.0") is Publish.DRA  # unmanaged: the policy's

    m = resolve(doc, "mixed", mixed.gpus, "n", "flag", catalog=CATALOG)
    assert m.policy.publish is Publish.DEVICE_PLUGIN
    assert {g.address: g.publish for g in m.gpus} == {
        "0000:08:00.0": Publish.DEVICE_PLUGIN,
        "0000:3b:00.0": Publish.DRA,
    }
    assert m.publish_for("0000:81:00.0") is Publish.DEVICE_PLUGIN

    plain = load_text(CONFIG.replace("policy: {publish: dra}\n", ""), "c.yaml", catalog=CATALOG)
    assert (
        resolve(plain, "top", mixed.gpus, "n", "flag", catalog=CATALOG).gpus[0].publish
        is Publish.DEVICE_PLUGIN
    )
    assert load_text(dump(doc), "again.yaml", catalog=CATALOG) == doc


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            CONFIG.replace("publish: dra}", "publish: DRA}"),
            "c.yaml:2:19: publish must be one of device-plugin, dra, found 'DRA'; "
            "did you mean dra?",
        ),
        (
            CONFIG.replace("        publish: dra\n", "        publish: true\n"),
            "c.yaml:14:18: publish must be one of device-plugin, dra, found true",
        ),
    ],
)
def test_a_bad_choice_names_file_line_column_and_value(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_text(text, "c.yaml", catalog=CATALOG)
    assert any(str(i).startswith(message) for i in e.value.issues), [str(i) for i in e.value.issues]


@settings(max_examples=50, deadline=None)
@given(choices=st.lists(st.sampled_from(list(Publish)), min_size=3, max_size=3))
def test_every_vgpu_is_offered_through_exactly_one_channel(
    mixed: NodeSnapshot, choices: list[Publish]
) -> None:
    by_gpu = {g.address: c for g, c in zip(mixed.gpus, choices, strict=True)}
    channels = split(mixed, by_gpu.__getitem__)
    plugin = {v.key for g in channels.device_plugin.gpus for v in g.vgpus}
    dra = {v.key for g in channels.dra.gpus for v in g.vgpus}
    assert plugin.isdisjoint(dra)
    assert plugin | dra == {v.key for g in mixed.gpus for v in g.vgpus}
    # ResourceSlices are built from the DRA side only.
    published = {d.key for d in build_pool(channels.dra, catalog=CATALOG).devices.values()}
    assert published == dra
    for g in mixed.gpus:
        keys = {v.key for v in g.vgpus}
        assert keys <= (dra if by_gpu[g.address] is Publish.DRA else plugin)


def test_the_plan_and_validate_show_the_choice(tmp_path: Path) -> None:
    from vgpu_state.catalog import default_catalog
    from vgpu_state.config import StaticConfigSource
    from vgpu_state.reconcile import Ports, Settings, reconcile_once
    from vgpu_state.testing import FakeCluster

    ports = Ports(
        SimHost(MIXED, in_memory=True),
        FakeCluster("gpu-node-1"),
        StaticConfigSource(load_text(CONFIG, "c.yaml", catalog=CATALOG)),
    )
    report = reconcile_once(ports, Settings(catalog=default_catalog()), config_name="mixed")
    text = render_text(report.plan)
    headers = [line for line in text.splitlines() if line.startswith("  # gpu[")]
    assert [("[published through DRA]" in h) for h in headers] == [False, True, False]
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    result = CliRunner().invoke(cli, ["validate", "-f", str(config)])
    assert result.exit_code == 0, result.output
    assert "  top: every entry published through DRA" in result.output
    assert "  mixed: entries [1] published through DRA" in result.output


def test_the_reconcile_never_hands_dra_vgpus_to_the_device_plugin(tmp_path: Path) -> None:
    from vgpu_state.catalog import default_catalog
    from vgpu_state.config import StaticConfigSource
    from vgpu_state.reconcile import Mode, Ports, Settings, reconcile_once
    from vgpu_state.sim.node import open_sim
    from vgpu_state.sim.spec import parse_spec
    from vgpu_state.testing import FakeCluster, RecordingDevicePlugin, RecordingHost

    spec = (
        "node: n1\nlabels: {nvidia.com/vgpu.config: split}\ngpus:\n"
        '  - {address: "0000:3b:00.0", model: T4, layout: mdev}\n'
        '  - {address: "0000:af:00.0", model: T4, layout: mdev}\n'
    )
    config = (
        "version: v1\nvgpu-configs:\n  split:\n"
        '    - devices: ["0000:3b:00.0"]\n      vgpu-devices: {T4-4Q: 4}\n'
        '    - devices: ["0000:af:00.0"]\n      vgpu-devices: {T4-8Q: 2}\n      publish: dra\n'
    )
    sim = open_sim(parse_spec(spec, catalog=CATALOG))
    plugin = RecordingDevicePlugin()
    ports = Ports(
        RecordingHost(sim.host),
        FakeCluster(sim.cluster.node_name(), sim.cluster.labels()),
        StaticConfigSource(load_text(config, "c.yaml", catalog=CATALOG)),
        plugin,
    )
    settings = Settings(catalog=default_catalog(), journal_path=tmp_path / "j.jsonl")
    report = reconcile_once(ports, settings, mode=Mode.APPLY)
    assert report.converged
    (advertised,) = plugin.snapshots
    assert [len(g.vgpus) for g in report.final.gpus] == [4, 2]
    assert [len(g.vgpus) for g in advertised.gpus] == [4, 0]
    dra = split(report.final, report.inputs.desired.publish_for).dra
    assert {d.key for d in build_pool(dra, catalog=CATALOG).devices.values()} == {
        v.key for v in report.final.gpus[1].vgpus
    }


def test_the_agent_in_plan_only_mode_advertises_no_dra_vgpu(tmp_path: Path) -> None:
    import threading

    from vgpu_state.agent.metrics import AgentMetrics
    from vgpu_state.agent.queue import Batch
    from vgpu_state.agent.reconciler import AgentMode, NodeReconciler
    from vgpu_state.agent.triggers import Trigger
    from vgpu_state.catalog import default_catalog
    from vgpu_state.config import StaticConfigSource
    from vgpu_state.reconcile import Ports, Settings
    from vgpu_state.sim.node import open_sim
    from vgpu_state.testing import FakeCluster, RecordingDevicePlugin, RecordingHost

    sim = open_sim(MIXED)
    try:
        plugin = RecordingDevicePlugin()
        ports = Ports(
            RecordingHost(sim.host),
            FakeCluster("gpu-node-1", {"nvidia.com/vgpu.config": "mixed"}),
            StaticConfigSource(load_text(CONFIG, "c.yaml", catalog=CATALOG)),
            plugin,
        )
        reconciler = NodeReconciler(
            ports, Settings(catalog=default_catalog()), AgentMetrics(), AgentMode.PLAN_ONLY
        )
        assert reconciler(Batch((Trigger.RESYNC,), 1), threading.Event()).ok
        (advertised,) = plugin.snapshots
        by_gpu = {g.address: len(g.vgpus) for g in advertised.gpus}
        assert by_gpu["0000:3b:00.0"] == 0  # published through DRA in config "mixed"
        assert by_gpu["0000:08:00.0"] == 2 and by_gpu["0000:81:00.0"] == 1
    finally:
        sim.close()
