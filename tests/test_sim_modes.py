"""The simulated driver's MIG mode, GPU instances and mixed-size mode, and its nvidia-smi.

What a user of the simulator notices: which types a VF lists in each mode, which
writes the driver refuses (EIO, ENXIO), what ``sriov-manage`` wipes, what the
``nvidia-smi`` stand-in answers and refuses (exit status and message), and that
a scan reads the modes only on a node with nvidia-smi.
"""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import SysfsHost
from vgpu_state.model.errors import DeviceBusyError, DriverError, InterfaceMissingError
from vgpu_state.sim.fuse import mounted
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import SpecError, dump_spec, parse_spec, save_spec
from vgpu_state.sim.sysfs import SimSysfs
from vgpu_state.sim.writelog import load_node, log_path

CATALOG = default_catalog()
PRO = "RTX PRO 6000 Blackwell Server Edition"
PF = "0000:3b:00.0"
BUS = "00000000:3B:00.0"
L40S = "0000:26:00.0"


def node(gpu: str, *, smi: bool = True) -> str:
    return f"node: n\nnvidia-smi: {'true' if smi else 'false'}\ngpus:\n{gpu}"


def pro(extra: str = "", vgpus: str = "") -> str:
    text = f'  - address: "{PF}"\n    model: {PRO}\n    layout: vendor-vfio\n'
    text += "".join(f"    {line}\n" for line in extra.splitlines())
    if vgpus:
        text += "    vgpus:\n" + "".join(f"      - {v}\n" for v in vgpus.splitlines())
    return text


def l40s(extra: str = "", vgpus: str = "") -> str:
    text = f'  - address: "{L40S}"\n    model: L40S\n    layout: vendor-vfio\n'
    text += "".join(f"    {line}\n" for line in extra.splitlines())
    if vgpus:
        text += "    vgpus:\n" + "".join(f"      - {v}\n" for v in vgpus.splitlines())
    return text


def sysfs(text: str) -> SimSysfs:
    return SimSysfs(parse_spec(text, "node.yaml", catalog=CATALOG), CATALOG)


def vf_dir(s: SimSysfs, pf: str, index: int) -> str:
    g = s.driver.gpu(pf)
    assert g is not None
    return f"bus/pci/devices/{g.vf_addresses()[index]}/nvidia"


def listed(s: SimSysfs, pf: str, index: int) -> list[str]:
    text = s.read(f"{vf_dir(s, pf, index)}/creatable_vgpu_types").decode()
    return [line.split()[-1] for line in text.splitlines()[1:]]


def type_id(name: str) -> int:
    t = CATALOG.type(name)
    assert t is not None
    return t.type_id


def set_type(s: SimSysfs, pf: str, index: int, name: str) -> None:
    s.write(f"{vf_dir(s, pf, index)}/current_vgpu_type", str(type_id(name)).encode())


def write_errno(s: SimSysfs, pf: str, index: int, name: str) -> int:
    with pytest.raises(OSError) as info:
        set_type(s, pf, index, name)
    return info.value.errno or 0


def smi(s: SimSysfs, *args: str) -> tuple[int, str]:
    return s.driver.nvidia_smi(list(args))


# the spec ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (node(l40s("mig-mode: true")), "gpus[0].mig-mode: L40S has no MIG-backed vGPU types"),
        (node(pro("gpu-instances: [1g.24gb]")), "gpu-instances: GPU instances need mig-mode"),
        (
            node(pro("sriov: false\nmig-mode: true\ngpu-instances: [1g.24gb]")),
            "GPU instances need SR-IOV on",
        ),
        (
            node(pro("mig-mode: true\ngpu-instances: [1g.99gb]")),
            "gpus[0].gpu-instances[0]: RTX PRO 6000 Blackwell Server Edition has no GPU "
            "instance profile '1g.99gb'",
        ),
        (
            node(pro("mig-mode: true\ngpu-instances: [4g.96gb, 1g.24gb]")),
            "gpus[0].gpu-instances[1]: no room for a 1g.24gb GPU instance",
        ),
        (
            node(pro("layout: mdev\nheterogeneous: true").replace("    layout: vendor-vfio\n", "")),
            "gpus[0].heterogeneous: mixed-size mode needs the vendor-vfio layout",
        ),
        (
            node(pro("mig-mode: true\nheterogeneous: true")),
            "gpus[0].heterogeneous: not in MIG mode",
        ),
        (
            node(pro(vgpus="{type: DC-1-24Q}")),
            "gpus[0].vgpus[0].type: DC-1-24Q is MIG-backed: the GPU needs mig-mode: true",
        ),
        (
            node(pro("mig-mode: true\ngpu-instances: [1g.24gb]", "{type: DC-24Q}")),
            "DC-24Q is time-sliced; a GPU in MIG mode offers only MIG-backed types",
        ),
        (
            node(pro("mig-mode: true", "{type: DC-1-24Q}")),
            "a MIG-backed vGPU needs a GPU instance of its profile with room",
        ),
    ],
)
def test_bad_mode_specs_are_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        sysfs(text)
    assert message in str(info.value)


def test_a_bad_mode_value_names_file_line_and_field() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(node(pro("mig-mode: maybe")), "node.yaml", catalog=CATALOG)
    assert "node.yaml:7:15: gpus.0.mig-mode:" in str(info.value)


def test_modes_round_trip_through_the_spec() -> None:
    s = sysfs(
        node(
            pro(
                "mig-mode: true\ngpu-instances: [1g.24gb, 1g.24gb, 1g.24gb]",
                "{type: DC-1-12Q}\n{type: DC-1-12Q}\n{type: DC-1-6Q, gpu-instance: 3}",
            )
            + l40s("heterogeneous: true", "{type: L40S-12Q}\n{type: L40S-8Q}")
        )
    )
    # A hole among the GPU instances and among the slots: loading names alone would close it.
    assert smi(s, "mig", "-i", BUS, "-gi", "1", "-dgi")[0] == 19  # holds two vGPUs
    assert smi(s, "mig", "-i", BUS, "-gi", "2", "-dgi")[0] == 0
    set_type(s, L40S, 2, "L40S-8Q")
    s.write(f"{vf_dir(s, L40S, 1)}/current_vgpu_type", b"0")
    spec = s.to_spec()
    text = dump_spec(spec)
    assert "mig-mode: true" in text and "heterogeneous: true" in text
    assert "gpu-instance: 3" in text and "id: 3" in text and "placement: 2" in text
    assert "placement: 24" in text  # the second L40S-8Q; the first (slot 16) is gone
    again = SimSysfs(parse_spec(text, "saved.yaml", catalog=CATALOG), CATALOG)
    assert again.to_spec() == spec
    assert again.tree.entries == s.tree.entries


# creatable rules -------------------------------------------------------------------


def test_mig_mode_without_gpu_instances_lists_nothing_and_refuses_writes() -> None:
    s = sysfs(node(pro("mig-mode: true")))
    assert all(listed(s, PF, i) == [] for i in range(4))
    assert write_errno(s, PF, 0, "DC-1-24Q") == errno.EIO
    assert write_errno(s, PF, 0, "DC-24Q") == errno.EIO  # time-sliced: never in MIG mode


def test_mig_types_fill_gpu_instances_one_framebuffer_size_each() -> None:
    s = sysfs(node(pro("mig-mode: true\ngpu-instances: [1g.24gb]")))
    offered = listed(s, PF, 0)
    assert "DC-1-24Q" in offered and "DC-1-12Q" in offered and "DC-1-6Q" in offered
    assert not [t for t in offered if t.count("-") == 1]  # no time-sliced type
    assert "DC-2-48Q" not in offered  # no 2g GPU instance
    set_type(s, PF, 0, "DC-1-12Q")
    # The GPU instance holds 12 GiB vGPUs now: only that size (any series) still fits.
    assert listed(s, PF, 1) == ["DC-1-12Q", "DC-1-12C"]
    assert write_errno(s, PF, 1, "DC-1-6Q") == errno.EIO
    set_type(s, PF, 1, "DC-1-12C")
    assert listed(s, PF, 2) == []  # two per 1g.24gb instance
    assert write_errno(s, PF, 2, "DC-1-12Q") == errno.EIO
    assert s.read(f"{vf_dir(s, PF, 1)}/gpu_instance_id") == b"1\n"
    # A second instance takes another size.
    assert smi(s, "mig", "-i", BUS, "-cgi", "1g.24gb", "-C")[0] == 0
    set_type(s, PF, 2, "DC-1-6Q")
    assert s.read(f"{vf_dir(s, PF, 2)}/gpu_instance_id") == b"2\n"
    assert s.read(f"{vf_dir(s, PF, 2)}/placement_id") == b"0\n"


def test_a_type_with_its_own_profile_takes_a_whole_instance() -> None:
    s = sysfs(node(pro("mig-mode: true\ngpu-instances: [1g.24gb, 1g.24gb, 1g.24gb, 1g.24gb]")))
    for vf in range(4):
        set_type(s, PF, vf, "DC-1-24Q")
    assert [v.gpu_instance for v in s.driver.gpus[0].vgpus] == [1, 2, 3, 4]
    assert listed(s, PF, 4) == []
    assert write_errno(s, PF, 4, "DC-1-24Q") == errno.EIO


def test_mixed_size_mode_places_sizes_in_aligned_slots() -> None:
    s = sysfs(node(l40s("heterogeneous: true")))
    set_type(s, L40S, 0, "L40S-12Q")
    set_type(s, L40S, 1, "L40S-12Q")
    set_type(s, L40S, 2, "L40S-8Q")
    placements = [s.read(f"{vf_dir(s, L40S, i)}/placement_id") for i in range(3)]
    assert placements == [b"0\n", b"12\n", b"24\n"]
    # 48 slots of 1 GiB (the catalog's grid): 32 are taken, so an L40S-16Q (16
    # slots at 32) still fits, an L40S-24Q (24 aligned slots) does not.
    assert "L40S-16Q" in listed(s, L40S, 3)
    assert "L40S-24Q" not in listed(s, L40S, 3)
    set_type(s, L40S, 3, "L40S-16Q")
    assert s.read(f"{vf_dir(s, L40S, 3)}/placement_id") == b"32\n"
    assert listed(s, L40S, 4) == []  # 48 of 48 GiB


def test_an_infeasible_mix_is_refused_in_mixed_size_mode() -> None:
    s = sysfs(node(l40s("heterogeneous: true")))
    set_type(s, L40S, 0, "L40S-8Q")  # slots 0-7
    set_type(s, L40S, 1, "L40S-16Q")  # slots 16-31 (aligned to 16)
    # 24 GiB are free (8-15, 32-47), but no aligned run of 24 slots is.
    assert "L40S-24Q" not in listed(s, L40S, 2)
    assert write_errno(s, L40S, 2, "L40S-24Q") == errno.EIO
    assert "L40S-16Q" in listed(s, L40S, 2)  # slots 32-47


def test_the_issue_mix_fits_in_mixed_size_mode() -> None:
    s = sysfs(node(l40s("heterogeneous: true")))
    set_type(s, L40S, 0, "L40S-24Q")
    set_type(s, L40S, 1, "L40S-12Q")
    set_type(s, L40S, 2, "L40S-12Q")
    placements = [s.read(f"{vf_dir(s, L40S, i)}/placement_id") for i in range(3)]
    assert placements == [b"0\n", b"24\n", b"36\n"]
    assert listed(s, L40S, 3) == []


def test_equal_size_mode_keeps_one_size() -> None:
    s = sysfs(node(l40s()))
    set_type(s, L40S, 0, "L40S-12Q")
    assert write_errno(s, L40S, 1, "L40S-8Q") == errno.EIO
    assert s.read(f"{vf_dir(s, L40S, 0)}/placement_id") == b"0\n"
    set_type(s, L40S, 1, "L40S-12A")
    assert s.read(f"{vf_dir(s, L40S, 1)}/placement_id") == b"1\n"


def test_gpu_instance_and_placement_ids_read_enxio_without_a_vgpu() -> None:
    s = sysfs(node(pro("mig-mode: true\ngpu-instances: [1g.24gb]")))
    for name in ("gpu_instance_id", "placement_id"):
        with pytest.raises(OSError) as info:
            s.read(f"{vf_dir(s, PF, 0)}/{name}")
        assert info.value.errno == errno.ENXIO


# sriov-manage ------------------------------------------------------------------------


def test_sriov_manage_disable_wipes_types_instances_and_mixed_size_but_not_mig_mode() -> None:
    s = sysfs(
        node(
            pro("mig-mode: true\ngpu-instances: [1g.24gb, 2g.48gb]", "{type: DC-1-24Q}")
            + l40s("heterogeneous: true", "{type: L40S-12Q}")
        )
    )
    assert s.driver.sriov_manage(f"-d {PF}")[0] == 0
    assert s.driver.sriov_manage(f"-d {L40S}")[0] == 0
    pro_gpu, l40s_gpu = s.driver.gpu(PF), s.driver.gpu(L40S)
    assert pro_gpu is not None and l40s_gpu is not None
    assert pro_gpu.mig_mode and not pro_gpu.gpu_instances and not pro_gpu.vgpus
    assert not l40s_gpu.heterogeneous and not l40s_gpu.vgpus
    assert "Current                                   : Enabled" in smi(s, "-q", "-i", BUS)[1]


def test_sriov_manage_enable_wipes_gpu_instances_made_before_it() -> None:
    s = sysfs(node(pro("sriov: false\nmig-mode: true")))
    assert smi(s, "mig", "-i", BUS, "-cgi", "1g.24gb", "-C")[0] == 0
    assert smi(s, "mig", "-lgi", "-i", BUS)[0] == 0
    assert s.driver.sriov_manage(f"-e {PF}")[0] == 0
    assert smi(s, "mig", "-lgi", "-i", BUS) == (6, "No GPU instances found: Not Found")
    # Already enabled: nothing is rebound, nothing wiped.
    assert smi(s, "mig", "-i", BUS, "-cgi", "1g.24gb")[0] == 0
    assert s.driver.sriov_manage(f"-e {PF}")[0] == 0
    assert smi(s, "mig", "-lgi", "-i", BUS)[0] == 0


# the nvidia-smi stand-in ---------------------------------------------------------------


def test_stand_in_refusals() -> None:
    s = sysfs(node(pro(vgpus="{type: DC-24Q}") + l40s(vgpus="{type: L40S-12Q}")))
    assert smi(s, "-i", BUS, "-mig", "1") == (
        19,
        f"Unable to enable MIG Mode for GPU {BUS}: In use by another client",
    )
    assert smi(s, "vgpu", "-i", L40S, "-shm", "1") == (
        19,
        "Unable to set vGPU heterogeneous mode for GPU 00000000:26:00.0: In use by another client",
    )
    assert smi(s, "mig", "-i", BUS, "-cgi", "1g.24gb", "-C") == (
        3,
        "Unable to create a GPU instance on GPU  1 using profile 1g.24gb: Not Supported",
    )
    assert smi(s, "-i", "0000:26:00.0", "-mig", "1")[0] == 3  # L40S: no MIG
    assert smi(s, "-i", BUS, "-mig", "0")[0] == 0  # already off: nothing to do
    assert smi(s, "mig", "-i", BUS, "-lgi")[0] == 3
    assert smi(s, "-i", BUS, "--bogus")[0] == 2
    assert smi(s, "-q")[0] == 2  # no GPU named
    assert smi(s, "-q", "-i", "0000:99:00.0") == (6, "No devices were found")


def test_stand_in_refusals_in_mig_mode() -> None:
    s = sysfs(node(pro("mig-mode: true\ngpu-instances: [1g.24gb]", "{type: DC-1-24Q}")))
    assert smi(s, "vgpu", "-i", BUS, "-shm", "1") == (
        3,
        f"Unable to set vGPU heterogeneous mode for GPU {BUS}: Not Supported",
    )
    assert smi(s, "mig", "-i", BUS, "-cgi", "1g.99gb") == (2, "Unable to find profile 1g.99gb")
    assert smi(s, "mig", "-i", BUS, "-cgi", "4g.96gb") == (
        2,
        "Unable to create a GPU instance on GPU  0 using profile 4g.96gb: Insufficient Resources",
    )
    assert smi(s, "mig", "-i", BUS, "-gi", "1", "-dci")[0] == 19
    assert smi(s, "mig", "-i", BUS, "-gi", "1", "-dgi") == (
        19,
        "Unable to destroy GPU instance ID  1 from GPU  0: In use by another client",
    )
    assert smi(s, "mig", "-i", BUS, "-gi", "7", "-dgi")[0] == 6
    set_type_zero = f"{vf_dir(s, PF, 0)}/current_vgpu_type"
    s.write(set_type_zero, b"0")
    assert smi(s, "mig", "-i", BUS, "-gi", "1", "-dgi") == (
        0,
        "Successfully destroyed GPU instance ID  1 from GPU  0",
    )


def test_stand_in_mode_changes_and_reads() -> None:
    s = sysfs(node(pro("sriov: false") + l40s()))
    assert smi(s, "-i", BUS, "-mig", "1") == (
        0,
        f"Enabled MIG Mode for GPU {BUS}\nAll done.",
    )
    assert s.driver.sriov_manage(f"-e {PF}")[0] == 0
    status, out = smi(s, "mig", "-i", BUS, "-cgi", "1g.24gb,2g.48gb", "-C")
    assert status == 0
    assert out.splitlines()[0].startswith("Successfully created GPU instance ID  1 on GPU  1")
    assert "using profile MIG 2g.48gb" in out.splitlines()[2]
    rows = [line for line in smi(s, "mig", "-lgi", "-i", BUS)[1].splitlines() if " MIG " in line]
    assert len(rows) == 2 and "0:1" in rows[0] and "2:2" in rows[1]
    assert smi(s, "vgpu", "-i", L40S, "-shm", "1") == (
        0,
        "Heterogeneous vGPU mode enabled for GPU 00000000:26:00.0",
    )
    assert "vGPU Heterogeneous Mode                       : Enabled" in smi(s, "-q", "-i", L40S)[1]


# the host: SimHost, the write log, FUSE --------------------------------------------------


def test_scan_reads_modes_only_on_a_node_with_nvidia_smi() -> None:
    gpus = pro("mig-mode: true\ngpu-instances: [1g.24gb]", "{type: DC-1-24Q}") + l40s(
        vgpus="{type: L40S-12Q}"
    )
    gpus += '  - {address: "0000:08:00.0", model: A2}\n'
    with SimHost(parse_spec(node(gpus, smi=False), catalog=CATALOG), in_memory=True) as host:
        without = host.scan()
        with pytest.raises(InterfaceMissingError):
            host.set_mig_mode(PF, False)
    assert all(g.modes is None for g in without.gpus)
    assert all(
        v.gpu_instance_id is None and v.placement_id is None for g in without.gpus for v in g.vgpus
    )
    with SimHost(parse_spec(node(gpus), catalog=CATALOG), in_memory=True) as host:
        got = host.scan()
    by = {g.address: g for g in got.gpus}
    modes = by[PF].modes
    assert modes is not None and modes.mig and modes.heterogeneous is None
    assert modes.gi_counts() == {"1g.24gb": 1}
    assert by[PF].vgpus[0].gpu_instance_id == 1 and by[PF].vgpus[0].placement_id == 0
    l40s_modes = by[L40S].modes
    assert l40s_modes is not None and l40s_modes.mig is None and l40s_modes.heterogeneous is False
    assert by[L40S].vgpus[0].gpu_instance_id is None and by[L40S].vgpus[0].placement_id == 0
    # The mdev GPU is read as before: no modes, its vGPUs unchanged.
    assert by["0000:08:00.0"].modes is None
    assert by["0000:08:00.0"] == {g.address: g for g in without.gpus}["0000:08:00.0"]


def test_mode_changes_are_in_the_write_log_in_order(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(node(pro(vgpus="{type: DC-24Q}")))
    with SimHost(path, in_memory=True, autosave=True) as host:
        vf = host.scan().gpus[0].vgpus[0].parent
        host.clear_vf_type(vf)
        with pytest.raises(DeviceBusyError):
            host.set_mig_mode(PF, True)  # the VFs are on
        host.disable_sriov(PF)
        host.set_mig_mode(PF, True)
        host.enable_sriov(PF)
        assert [host.create_gpu_instance(PF, "1g.24gb") for _ in range(4)] == [1, 2, 3, 4]
        host.set_vf_type(vf, type_id("DC-1-24Q"))
        with pytest.raises(DeviceBusyError):
            host.destroy_gpu_instance(PF, 1)
        expected = host.scan()
    lines = [json.loads(x) for x in log_path(path).read_text().splitlines()[1:]]
    steps = [(x["path"].rsplit("/", 1)[-1], x["data"]) for x in lines]
    assert steps == [
        ("current_vgpu_type", "0"),
        ("nvidia-smi", f"-i {BUS} -mig 1"),
        ("sriov-manage", f"-d {PF}"),
        ("nvidia-smi", f"-i {BUS} -mig 1"),
        ("sriov-manage", f"-e {PF}"),
        *[("nvidia-smi", f"mig -i {BUS} -cgi 1g.24gb -C")] * 4,
        ("current_vgpu_type", str(type_id("DC-1-24Q"))),
        ("nvidia-smi", f"mig -i {BUS} -gi 1 -dci"),
    ]
    # Replaying the log reaches the same node.
    with SimHost(load_node(path, CATALOG)[0], in_memory=True) as again:
        assert again.scan() == expected


def test_host_layer_destroys_and_verifies(tmp_path: Path) -> None:
    with SimHost(parse_spec(node(pro("mig-mode: true")), catalog=CATALOG), in_memory=True) as h:
        gi = h.create_gpu_instance(PF, "2g.48gb")
        h.destroy_gpu_instance(PF, gi)
        modes = h.scan().gpus[0].modes
        assert modes is not None and modes.gpu_instances == ()
        with pytest.raises(DriverError) as info:
            h.create_gpu_instance(PF, "1g.99gb")
        assert "Unable to find profile 1g.99gb" in str(info.value)
        h.disable_sriov(PF)
        h.set_mig_mode(PF, False)
        modes = h.scan().gpus[0].modes
        assert modes is not None and modes.mig is False


@pytest.mark.fuse
@pytest.mark.usefixtures("require_fuse")
def test_stand_in_refusals_through_fuse(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    save_spec(
        parse_spec(
            node(
                pro(vgpus="{type: DC-24Q}")
                + l40s(vgpus="{type: L40S-12Q}")
                + '  - address: "0000:5e:00.0"\n    model: RTX PRO 6000 Blackwell Server '
                "Edition\n    layout: vendor-vfio\n    mig-mode: true\n"
                "    gpu-instances: [1g.24gb]\n    vgpus: [{type: DC-1-24Q}]\n"
            ),
            catalog=CATALOG,
        ),
        spec,
    )
    with mounted(spec, tmp_path / "mnt") as m:

        def run(*args: str) -> tuple[int, str]:
            done = subprocess.run(
                [*m.nvidia_smi_command(), *args], capture_output=True, text=True, timeout=60
            )
            return done.returncode, done.stdout.strip()

        assert run("-i", BUS, "-mig", "1") == (
            19,
            f"Unable to enable MIG Mode for GPU {BUS}: In use by another client",
        )
        assert run("vgpu", "-i", L40S, "-shm", "1")[0] == 19
        mig = "00000000:5E:00.0"
        assert run("vgpu", "-i", mig, "-shm", "1")[0] == 3
        assert run("mig", "-i", BUS, "-cgi", "1g.24gb", "-C")[0] == 3
        assert run("mig", "-i", mig, "-cgi", "4g.96gb")[0] == 2
        assert run("mig", "-i", mig, "-cgi", "1g.99gb") == (2, "Unable to find profile 1g.99gb")
        assert run("mig", "-i", mig, "-gi", "1", "-dgi")[0] == 19
        assert run("--help-me")[0] == 2
        # The host layer parses the stand-in's answers: modes and ids from the mount.
        host = SysfsHost(str(m.root), "n", "", catalog=CATALOG, nvidia_smi=m.nvidia_smi_command())
        gpu = {g.address: g for g in host.scan().gpus}["0000:5e:00.0"]
        assert gpu.modes is not None and gpu.modes.gi_counts() == {"1g.24gb": 1}
        assert gpu.vgpus[0].gpu_instance_id == 1
        assert host.create_gpu_instance("0000:5e:00.0", "1g.24gb") == 2


def test_an_extra_mig_backed_type_gets_a_profile_of_its_own() -> None:
    text = node(pro("mig-mode: true\ngpu-instances: [1g.16gb]", "{type: DC-1-16Q}"))
    text = text.replace(
        "nvidia-smi: true\n",
        "nvidia-smi: true\ndriver:\n  extra-types:\n    - {name: DC-1-16Q, id: 3001, "
        f"framebuffer-mib: 16384, max-instances: 4, model: {PRO}}}\n",
    )
    s = sysfs(text)
    assert s.read(f"{vf_dir(s, PF, 0)}/gpu_instance_id") == b"1\n"
    assert "1g.16gb" in smi(s, "mig", "-lgi", "-i", BUS)[1]
