"""The node remembers the vGPU types its driver listed.

On the vendor-specific VFIO layout the driver lists creatable types (id and
name) only while something is creatable. Once a GPU is full no VF lists any
type, so a vGPU of a type the catalog does not know is named only by what an
earlier scan of the same node saw the driver list: within one command from the
scan before the apply, across commands from ``driver-types.json`` in the state
directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.builders import build_gpu, build_snapshot
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.model.drivertypes import DriverTypes, DriverTypesError
from vgpu_state.model.snapshot import CreatableType, NodeSnapshot, Vgpu
from vgpu_state.ports import MemoryCluster
from vgpu_state.reconcile import Mode, Ports, Settings, reconcile_once
from vgpu_state.sim.fuse import mounted
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec
from vgpu_state.statefiles.drivertypes import (
    MAX_DRIVER_TYPES_BYTES,
    DriverTypeMemory,
    DriverTypesFile,
)
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

CATALOG = default_catalog()

NEWER_DRIVER = """\
node: l40s-node
driver:
  flavour: all
  extra-types:
    - {name: L40S-5Q, id: 2301, framebuffer-mib: 5120, max-instances: 9}
gpus:
  - address: "0000:26:00.0"
    model: L40S
    layout: vendor-vfio
"""

FULL = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {L40S-5Q: 9}\n"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def _files(tmp_path: Path) -> tuple[Path, Path]:
    spec = tmp_path / "node.yaml"
    spec.write_text(NEWER_DRIVER)
    config = tmp_path / "c.yaml"
    config.write_text(FULL)
    return spec, config


# through the CLI, in memory -------------------------------------------------------------


def test_filling_a_gpu_with_a_newer_drivers_type_applies_asserts_and_plans_no_changes(
    tmp_path: Path,
) -> None:
    spec, config = _files(tmp_path)
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    code, out, err = run("apply", *args, "--auto-approve")
    assert code == 0, out + err
    assert "Plan: 9 to create, 0 to destroy, 0 blocked." in out
    assert "missing" not in out + err
    assert "type id" not in out + err
    state = spec.with_name(spec.name + ".driver-types.json")
    assert json.loads(state.read_text())["format_version"] == 1
    code, out, err = run("assert", *args)
    assert (code, out.strip()) == (0, 'The node matches configuration "c" (-c c).'), err
    code, out, err = run("plan", *args, "--detailed-exitcode")
    assert code == 0, out + err
    assert 'No changes. The node matches configuration "c".' in out
    code, out, err = run("export", "--sim", str(spec))
    assert code == 0, err
    assert "L40S-5Q: 9" in out
    code, out, err = run("scan", "--sim", str(spec), "-o", "json")
    assert code == 0, err
    names = [v["type_name"] for v in json.loads(out)["gpus"][0]["vgpus"]]
    assert names == ["L40S-5Q"] * 9


def test_without_a_usable_state_file_one_apply_still_verifies(tmp_path: Path) -> None:
    """The scan before the apply names the vGPUs of the scan after it, with no state file."""
    spec, config = _files(tmp_path)
    (tmp_path / "state" / "driver-types.json").mkdir(parents=True)
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    journal = ["--journal", str(tmp_path / "state" / "journal.jsonl")]
    code, out, err = run("apply", *args, *journal, "--auto-approve")
    assert code == 0, out + err
    assert "Plan: 9 to create, 0 to destroy, 0 blocked." in out
    assert "driver-types.json: the driver-types file is a directory" in err
    # The next command has nothing that names type 2301: neither the catalog, nor the
    # (empty) listings of the full GPU, nor a state file.
    code, out, err = run("assert", *args, *journal)
    assert code == 1
    assert "the type id of L40S-5Q is unknown" in err


def test_one_reconcile_without_a_state_path_names_what_it_created() -> None:
    spec = parse_spec(NEWER_DRIVER, catalog=CATALOG)
    with SimHost(spec, in_memory=True, catalog=CATALOG) as host:
        ports = Ports(
            host,
            MemoryCluster("l40s-node"),
            StaticConfigSource(load_text(FULL, "c.yaml", catalog=CATALOG)),
        )
        settings = Settings(catalog=CATALOG)
        report = reconcile_once(ports, settings, mode=Mode.APPLY, config_name="c")
        assert report.differences == ()
        assert report.applied is not None
        assert [v.type_name for v in report.final.gpus[0].vgpus] == ["L40S-5Q"] * 9
        again = reconcile_once(ports, settings, mode=Mode.PLAN, config_name="c")
        assert again.plan.is_converged and again.differences == ()


def test_the_state_file_follows_the_journal_flag(tmp_path: Path) -> None:
    spec, config = _files(tmp_path)
    state = tmp_path / "state"
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    journal = ["--journal", str(state / "journal.jsonl")]
    code, out, err = run("apply", *args, *journal, "--auto-approve")
    assert code == 0, out + err
    assert (state / "driver-types.json").is_file()
    assert not spec.with_name(spec.name + ".driver-types.json").exists()
    code, _, _ = run("assert", *args, *journal)
    assert code == 0
    code, _, _ = run("assert", *args)  # another state directory: knows nothing
    assert code == 1


@pytest.mark.parametrize(
    ("content", "warning"),
    [
        pytest.param(b"{not json", "not valid JSON", id="not-json"),
        pytest.param(b"[]", "not a driver-types table", id="wrong-shape"),
        pytest.param(
            b'{"format_version": 1, "gpus": {"10de:26b9:1851": {"x": '
            b'{"name": "L40S-5Q", "sysfs_name": null}}}}',
            "'x'",
            id="bad-type-id",
        ),
        pytest.param(b"\xff\xfe", "not valid JSON", id="not-utf8"),
        pytest.param(b" " * (MAX_DRIVER_TYPES_BYTES + 1), "larger than", id="too-large"),
    ],
)
def test_a_corrupt_state_file_is_a_warning_and_ignored(
    tmp_path: Path, content: bytes, warning: str
) -> None:
    spec, config = _files(tmp_path)
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    state = spec.with_name(spec.name + ".driver-types.json")
    state.write_bytes(content)
    code, out, err = run("apply", *args, "--auto-approve")
    assert code == 0, out + err  # the apply's own scan names the types
    assert f"warning: {state}: " in err and warning in err and "ignored" in err
    assert "Traceback" not in err
    # The apply saw the driver list the type and wrote a fresh table.
    code, _, err = run("assert", *args)
    assert code == 0, err
    assert "driver-types" not in err


def test_a_symlinked_state_file_is_neither_followed_nor_replaced(tmp_path: Path) -> None:
    spec, config = _files(tmp_path)
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    target = tmp_path / "victim"
    target.write_text("precious\n")
    state = spec.with_name(spec.name + ".driver-types.json")
    state.symlink_to(target)
    code, out, err = run("apply", *args, "--auto-approve")
    assert code == 0, out + err
    assert "is a symlink" in err
    assert target.read_text() == "precious\n"
    assert state.is_symlink()


def test_the_agent_keeps_the_table_in_its_state_dir_across_restarts(tmp_path: Path) -> None:
    from vgpu_state.agent.assemble import AgentFlags, open_agent_node

    spec, _ = _files(tmp_path)
    flags = AgentFlags(
        node="l40s-node",
        config_file=tmp_path / "config.yaml",
        sim_spec=str(spec),
        state_dir=tmp_path / "state",
    )
    state = flags.state_dir / "driver-types.json"
    config = StaticConfigSource(load_text(FULL, "c.yaml", catalog=CATALOG))
    settings = Settings(catalog=CATALOG, driver_types_path=state)
    for mode in (Mode.APPLY, Mode.PLAN):  # the agent restarts between the two
        node = open_agent_node(flags)
        try:
            ports = Ports(node.host, MemoryCluster("l40s-node"), config)
            report = reconcile_once(ports, settings, mode=mode, config_name="c")
        finally:
            node.save()
            node.close()
        assert report.differences == ()
        assert [v.type_name for v in report.final.gpus[0].vgpus] == ["L40S-5Q"] * 9
        assert state.is_file()
    assert report.plan.is_converged


def test_the_device_plugin_advertises_a_full_gpu_of_a_newer_drivers_type(tmp_path: Path) -> None:
    """Started while the GPU lists the type, the plugin still names it once the GPU is full."""
    spec, config = _files(tmp_path)
    plugin_dir = Path(tempfile.mkdtemp(prefix="dpm-", dir="/tmp"))
    resource = "nvidia.com/NVIDIA_L40S-5Q"
    serve = ["deviceplugin", "--sim", str(spec), "--device-plugin-dir", str(plugin_dir)]
    try:
        with DevicePluginKubelet(str(plugin_dir)) as kubelet:
            proc = subprocess.Popen(
                [sys.executable, "-m", "vgpu_state.cli.main", *serve],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                assert proc.stderr is not None
                for line in proc.stderr:  # it has scanned the free GPU once
                    if "no vGPUs to advertise" in line:
                        break
                else:
                    pytest.fail("the device plugin ended before its first scan")
                args = ["-f", str(config), "-c", "c", "--sim", str(spec), "--auto-approve"]
                applied = _cli("apply", *args)
                assert applied.returncode == 0, applied.stdout + applied.stderr
                seen = kubelet.wait_for(resource, lambda d: len(d) == 9, timeout=15)
                assert len(seen) == 9
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=10)
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)


# through the FUSE frontend, one CLI process per command -----------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args], capture_output=True, text=True
    )


@pytest.mark.usefixtures("require_fuse")
def test_fuse_filling_a_gpu_with_a_newer_drivers_type(tmp_path: Path) -> None:
    spec, config = _files(tmp_path)
    with mounted(spec, tmp_path / "mnt") as m:
        common = [
            "-f", str(config), "-c", "c", "--sysfs-root", str(m.root), "--node", "l40s-node",
            "--journal", str(tmp_path / "state" / "journal.jsonl"),
        ]  # fmt: skip
        lock = ["--lock-file", str(tmp_path / "lock"), "--sriov-manage", ""]
        done = _cli("apply", *common, *lock, "--auto-approve")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Plan: 9 to create, 0 to destroy, 0 blocked." in done.stdout
        table = json.loads((tmp_path / "state" / "driver-types.json").read_text())
        assert table["gpus"]["10de:26b9:1851"]["2301"]["name"] == "L40S-5Q"
        checked = _cli("assert", *common)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        again = _cli("plan", *common, "--detailed-exitcode")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "No changes." in again.stdout


# the lookup itself --------------------------------------------------------------------


def _full_l40s(type_id: int, name: str | None) -> NodeSnapshot:
    g = build_gpu("0000:26:00.0", "L40S", layout="vendor-vfio")
    vgpu = Vgpu(kind="vf", parent=g.vfs[0].address, type_id=type_id, type_name=name)
    return build_snapshot(g.model_copy(update={"vgpus": (vgpu,)}))


def _listing(type_id: int, name: str) -> NodeSnapshot:
    g = build_gpu("0000:26:00.0", "L40S", layout="vendor-vfio")
    listed = (CreatableType(type_id=type_id, name=name, available=1, sysfs_name=f"NVIDIA {name}"),)
    vf = g.vfs[0].model_copy(update={"creatable": listed})
    return build_snapshot(g.model_copy(update={"vfs": (vf, *g.vfs[1:])}))


def test_a_remembered_name_names_only_what_nothing_else_names() -> None:
    memory = DriverTypes().learn(_listing(2301, "L40S-5Q"))
    named = memory.name_vgpus(_full_l40s(2301, None))
    assert [(v.type_name, v.type_sysfs_name) for v in named.gpus[0].vgpus] == [
        ("L40S-5Q", "NVIDIA L40S-5Q")
    ]
    # What the scan named (catalog or live listing) stays as it is.
    kept = memory.name_vgpus(_full_l40s(2301, "L40S-6Q"))
    assert kept.gpus[0].vgpus[0].type_name == "L40S-6Q"
    # A later listing that names the id differently replaces the remembered name.
    relearned = memory.learn(_listing(2301, "L40S-5C"))
    assert relearned.name_vgpus(_full_l40s(2301, None)).gpus[0].vgpus[0].type_name == "L40S-5C"
    # Another GPU model's listing says nothing about this one.
    other = build_snapshot(build_gpu("0000:08:00.0", "A2", layout="mdev"))
    unnamed = DriverTypes().learn(other).name_vgpus(_full_l40s(2301, None))
    assert unnamed.gpus[0].vgpus[0].type_name is None


def test_the_table_round_trips_and_the_parse_is_strict() -> None:
    table = DriverTypes().learn(_listing(2301, "L40S-5Q"))
    assert DriverTypes.parse(table.dumps()) == table
    with pytest.raises(DriverTypesError):
        DriverTypes.parse('{"format_version": 2, "gpus": {}}')
    with pytest.raises(DriverTypesError):
        DriverTypes.parse('{"format_version": 1, "gpus": {}, "more": 1}')
    with pytest.raises(DriverTypesError):
        DriverTypes.parse(
            '{"format_version": 1, "gpus": {"10de:26b9:1851": {"2301": {"name": 5}}}}'
        )


def test_memory_saves_only_when_the_driver_lists_something_new(tmp_path: Path) -> None:
    saved: list[DriverTypes] = []
    spec = parse_spec(NEWER_DRIVER, catalog=CATALOG)
    memory = DriverTypeMemory(save=saved.append)
    host = SimHost(spec, in_memory=True, catalog=CATALOG, driver_types=memory)
    try:
        host.scan()
        host.scan()
        assert len(saved) == 1
        assert saved[0].lookup(host.scan().gpus[0], 2301) is not None
    finally:
        host.close()


def test_the_file_is_written_atomically_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "driver-types.json"
    store = DriverTypesFile(path)
    assert store.load() == (DriverTypes(), None)
    table = DriverTypes().learn(_listing(2301, "L40S-5Q"))
    store.save(table)
    assert store.load() == (table, None)
    assert sorted(os.listdir(path.parent)) == ["driver-types.json"]
