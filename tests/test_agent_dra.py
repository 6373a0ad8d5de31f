"""The agent's DRA side end to end: reconcile -> slices -> kubelet registration and prepare
-> claims block a destroy -> shutdown removes the slices.

Real parts: the simulated node's sysfs tree, the real kube-apiserver + etcd of
the harness (``cluster``, ``tests/realcluster.py``), the plugin's unix sockets,
and a stand-in kubelet (:class:`~vgpu_state.testing.dra_kubelet.DraKubelet`).
The agent talks to the server as its ServiceAccount, with a token bound to a Pod
on its Node, under the shipped RBAC (``deploy/`` and its DRA component); the
server's own validation checks every ResourceSlice it writes. What a user or the
scheduler would do (a claim's allocation, the kubelet wiping the node's slices,
an uninstall's ``dra-remove-slices``) the test does as a cluster admin.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import ControlPlane
from vgpu_state.agent.dra import ClaimsHoldVgpus, DraNode
from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.dra.slices import DRIVER, PCI_BUS_ID, device_key
from vgpu_state.kube.api import KubeApi
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.reconcile import Mode, Ports, Settings, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import FakeCluster, RecordingDevicePlugin, dra_paths
from vgpu_state.testing.dra_kubelet import DraKubelet

CATALOG = default_catalog()

SIM = Path(__file__).resolve().parent.parent / "configs" / "sim"
NODE = "l40s-node"
GROW = """version: v1
vgpu-configs:
  layout:
    - devices: ["0000:a1:00.0"]
      vgpu-devices: {L40S-12Q: 4}
      publish: dra
"""
SHRINK = GROW.replace("{L40S-12Q: 4}", "{L40S-24Q: 2}")
SLICES = "resource.k8s.io/v1/resourceslices"
CLAIMS = "resource.k8s.io/v1/resourceclaims"


def _wait(what: str, check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-agent-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _agent_kubeconfig(cluster: ControlPlane, base: Path) -> Path:
    """A kubeconfig of the agent on NODE: its ServiceAccount's token, bound to its Pod."""
    return cluster.write_kubeconfig(base / "agent-kubeconfig", token=cluster.agent_token(NODE))


def _slices(cluster: ControlPlane) -> list[dict[str, Any]]:
    return cluster.list(SLICES)


def test_the_agents_dra_node_publishes_prepares_holds_and_cleans_up(
    cluster: ControlPlane, base: Path
) -> None:
    host = SimHost(SIM / "l40s-pair.yaml")
    kubelet: DraKubelet | None = None
    dra: DraNode | None = None
    kube = KubeApi.connect(str(_agent_kubeconfig(cluster, base)))
    try:
        paths = dra_paths(base, host.root)
        dra = DraNode(kube, NODE, paths, resync_seconds=3600, catalog=CATALOG).start()
        plugin = RecordingDevicePlugin()

        def ports(config: str) -> Ports:
            cluster = ClaimsHoldVgpus(FakeCluster(NODE), dra)
            return Ports(
                host,
                cluster,
                StaticConfigSource(load_text(config, "c.yaml", catalog=CATALOG)),
                plugin,
                dra,
            )

        settings = Settings(catalog=default_catalog())
        report = reconcile_once(ports(GROW), settings, mode=Mode.APPLY, config_name="layout")
        assert report.converged

        # Slices list exactly the four DRA vGPUs; the device plugin got the other two only.
        dra_keys = {v.key for v in report.final.gpu("0000:a1:00.0").vgpus}  # type: ignore[union-attr]
        objs = _slices(cluster)
        published = {
            d["attributes"][PCI_BUS_ID]["string"] for o in objs for d in o["spec"]["devices"]
        }
        assert published == dra_keys and len(dra_keys) == 4
        advertised = {v.key for g in plugin.snapshots[-1].gpus for v in g.vgpus}
        assert len(advertised) == 2 and advertised.isdisjoint(dra_keys)

        # The kubelet starts: it wipes the node's slices, then registers the plugin,
        # which republishes them at once.
        for o in objs:
            cluster.delete(SLICES, o["metadata"]["name"])
        assert _slices(cluster) == []
        kubelet = DraKubelet(paths.registry_dir)
        assert kubelet.register_all() == [DRIVER]
        _wait("slices back after registration", lambda: len(_slices(cluster)) == 1)

        # A claim on one of them (allocated by the scheduler, reserved for the VM's
        # pod) is prepared, and then holds it.
        device = sorted(d["name"] for o in _slices(cluster) for d in o["spec"]["devices"])[0]
        uid = cluster.write(
            CLAIMS,
            "render",
            {
                "spec": {
                    "devices": {
                        "requests": [{"name": "vgpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                },
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "vgpu",
                                    "driver": DRIVER,
                                    "pool": NODE,
                                    "device": device,
                                }
                            ]
                        }
                    },
                    "reservedFor": [
                        {
                            "resource": "pods",
                            "name": "virt-launcher-render-1",
                            "uid": "5f0c2d1e-0000-4000-8000-00000000b001",
                        }
                    ],
                },
            },
            namespace="vms",
        )["metadata"]["uid"]
        reply = kubelet.prepare(DRIVER, [("vms", "render", uid)]).claims[uid]
        assert reply.error == "" and reply.devices[0].device_name == device
        plan = reconcile_once(ports(SHRINK), settings, config_name="layout").plan
        destroys = [b for b in plan.blocked if b.kind.value == "destroy"]
        # The claimed L40S-12Q keeps every L40S-24Q out, so the switch is deferred:
        # its three free L40S-12Q stay too (blocked, not destroyed).
        assert [b.code.value for b in destroys].count("SwitchDeferred") == 3
        assert plan.actions == ()
        destroys = [b for b in destroys if b.code.value == "InUse"]
        assert len(destroys) == 1
        assert destroys[0].address == f"gpu[0000:a1:00.0].vf[{device_key(device)}]"
        holder = str(destroys[0].holder)
        assert "ResourceClaim vms/render" in holder and "virt-launcher-render-1" in holder

        # Shutdown (a restart or a rollout): sockets gone, slices kept (the kubelet
        # wipes them itself if the driver stays away); an uninstall deletes them.
        kept = sorted(o["metadata"]["name"] for o in _slices(cluster))
        assert kept
        dra.stop()
        assert sorted(o["metadata"]["name"] for o in _slices(cluster)) == kept
        assert not paths.socket.exists()
        dra.stop(remove_slices=True)
        dra = None
        assert _slices(cluster) == []
    finally:
        if kubelet is not None:
            kubelet.close()
        if dra is not None:
            dra.stop()
        host.close()
        kube.close()


def test_agent_dra_flag_wires_the_dra_node_into_the_reconcile(
    cluster: ControlPlane, base: Path
) -> None:

    from vgpu_state.agent.assemble import AgentFlags, build

    kubeconfig = _agent_kubeconfig(cluster, base)
    config_dir = base / "config"
    config_dir.mkdir()
    common = dict(
        node=NODE,
        config_file=config_dir / "config.yaml",
        kubeconfig=str(kubeconfig),
        listen="",
        state_dir=base / "state",
        in_use_file=str(base / "held"),
        device_plugin=False,
    )
    plain = build(AgentFlags(**common))  # type: ignore[arg-type]
    assert plain.parts.ports.dra.inner is None  # type: ignore[attr-defined]
    # What the agent withholds is recorded in its state directory, for `vgpu-state scan`.
    recorder = plain.parts.ports.withheld
    assert recorder.file.path == base / "state" / "withheld.json"  # type: ignore[attr-defined]
    assert not isinstance(plain.parts.ports.cluster, ClaimsHoldVgpus)

    flags = AgentFlags(
        **common,
        dra=True,
        dra_plugins_dir=base / "plugins",  # type: ignore[arg-type]
        dra_registry_dir=base / "registry",
        cdi_dir=base / "cdi",
    )
    agent = build(flags)
    dra = agent.parts.ports.dra
    dra = dra.inner  # type: ignore[attr-defined]
    assert isinstance(dra, DraNode) and dra.publisher.version == "v1"
    assert isinstance(agent.parts.ports.cluster, ClaimsHoldVgpus)
    stop = agent.parts.services[-1]()  # what Agent.run does
    try:
        assert (base / "registry" / f"{DRIVER}-reg.sock").exists()
        assert (base / "plugins" / DRIVER / "dra.sock").exists()
    finally:
        stop()
    assert not (base / "registry" / f"{DRIVER}-reg.sock").exists()


def test_vgpus_held_by_claims_are_held_in_the_reported_status_too() -> None:
    """The status (and so ``fleet plan``) must see a claim's vGPU as held, or a reviewer's
    dry run would plan to destroy it."""
    from vgpu_state.agent.cluster import ClusterSink
    from vgpu_state.model.inuse import InUse

    class Inner(FakeCluster):
        last_in_use: InUse | None = None

        def in_use(self) -> InUse:
            self.last_in_use = InUse({"pod-held": "pod default/p"})
            return self.last_in_use

        def __init__(self, node: str) -> None:
            super().__init__(node)
            self.observed: list[object] = []

        def observe(self, snapshot: object, held: object, *, in_use_known: bool) -> None:
            self.observed.append((held, in_use_known))

    class Claims:
        fail = False

        def holders(self) -> dict[str, str]:
            if self.fail:
                raise RuntimeError("API server gone")
            return {"claim-held": "ResourceClaim vms/gpu (pod vms/virt-launcher-x)"}

    inner, claims = Inner(NODE), Claims()
    port = ClaimsHoldVgpus(inner, claims)  # type: ignore[arg-type]
    assert dict(port.in_use()) == {
        "pod-held": "pod default/p",
        "claim-held": "ResourceClaim vms/gpu (pod vms/virt-launcher-x)",
    }
    sink = ClusterSink(inner, None)  # type: ignore[arg-type]
    sink.refresh(NodeSnapshot(node=NODE))
    held, known = inner.observed[-1]  # type: ignore[misc]
    assert known and "claim-held" in held  # type: ignore[operator]

    claims.fail = True
    with pytest.raises(RuntimeError):
        port.in_use()
    sink.refresh(NodeSnapshot(node=NODE))
    assert inner.observed[-1] == (None, False)


def test_a_dra_checkpoint_of_the_wrong_shape_stops_the_agent_with_a_clear_error(
    cluster: ControlPlane, base: Path
) -> None:
    """The right version, the wrong shape (an entry without its devices): the agent says
    which file, which claim and what is missing, and exits 1, instead of a KeyError."""
    import json

    from click.testing import CliRunner

    from vgpu_state.cli.main import cli

    kubeconfig = _agent_kubeconfig(cluster, base)
    checkpoint = base / "plugins" / DRIVER / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    uid = "0b4cf1a2-0000-4000-8000-000000000040"
    entry = {"namespace": "vms", "name": "render", "files": []}
    checkpoint.write_text(json.dumps({"version": 1, "claims": {uid: entry}}))
    (base / "config").mkdir()
    result = CliRunner().invoke(
        cli,
        ["agent", "--node", NODE, "--config", str(base / "config" / "config.yaml"),
         "--kubeconfig", str(kubeconfig), "--state-dir", str(base / "state"),
         "--in-use-file", str(base / "held"), "--no-device-plugin", "--listen", "",
         "--dra", "--dra-plugins-dir", str(base / "plugins"),
         "--dra-registry-dir", str(base / "registry"), "--cdi-dir", str(base / "cdi")],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert f"error: {checkpoint}: claim '{uid}': missing key 'devices'" in result.output
    assert "move it aside" in result.output
    assert not (base / "registry" / f"{DRIVER}-reg.sock").exists()


def _slice(node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "mdev-x"}],
        },
    }


def test_dra_remove_slices_deletes_the_drivers_slices_and_proves_none_is_left(
    cluster: ControlPlane, base: Path
) -> None:
    """The uninstall step: one node's slices, then every node's; another driver's stay.

    A cluster admin runs it (the agents are gone by then), with their own kubeconfig."""

    from click.testing import CliRunner

    from vgpu_state.cli.main import cli

    kubeconfig = cluster.write_kubeconfig(base / "kubeconfig", identity="user")
    for name, body in (("a-1", _slice("node-a")), ("a-2", _slice("node-a")),
                       ("b-1", _slice("node-b")),
                       ("gpu-a", _slice("node-a", driver="gpu.nvidia.com"))):  # fmt: skip
        cluster.write(SLICES, name, body)

    def names() -> list[str]:
        return sorted(o["metadata"]["name"] for o in _slices(cluster))

    run = CliRunner().invoke
    one = run(cli, ["dra-remove-slices", "--node", "node-a", "--kubeconfig", str(kubeconfig)])
    assert one.exit_code == 0, one.output
    assert "2 ResourceSlice(s) deleted; none left on node node-a" in one.output
    assert names() == ["b-1", "gpu-a"]
    every = run(cli, ["dra-remove-slices", "--kubeconfig", str(kubeconfig)])
    assert every.exit_code == 0, every.output
    assert "deleted ResourceSlice b-1" in every.output
    assert names() == ["gpu-a"]
