"""The simulated driver's rules and errno values (reference §2.3, §3.3, §4.2, §5.2, §6)."""

from __future__ import annotations

import errno

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.sim.driver_model import SimDriver
from vgpu_state.sim.spec import SpecError, dump_spec, parse_spec
from vgpu_state.sim.sysfs import SimSysfs
from vgpu_state.sim.tree import creatable_text

CATALOG = default_catalog()

U1 = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"
U2 = "c728e022-f16f-434b-ad2c-9665ee634d3d"


def a2(extra: str = "", vgpus: str = "[]") -> SimDriver:
    return SimDriver(
        parse_spec(
            f'gpus: [{{address: "0000:08:00.0", model: A2, vgpus: {vgpus}}}]\n{extra}',
            catalog=CATALOG,
        ),
        catalog=CATALOG,
    )


def errno_of(fn: object, *args: object) -> int:
    with pytest.raises(OSError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.errno or 0


def test_vf_numbering_is_ari_with_offset_4() -> None:
    g = a2().gpus[0]
    addrs = g.vf_addresses()
    assert (
        addrs[0] == "0000:08:00.4" and addrs[11] == "0000:08:01.7" and addrs[15] == "0000:08:02.3"
    )


def test_equal_size_rule() -> None:
    d = a2()
    g = d.gpus[0]
    t4q, t4c, t8q = (g.model.type(n) for n in ("A2-4Q", "A2-4C", "A2-8Q"))
    assert t4q and t4c and t8q
    assert g.available(0, t8q) == 1 and g.remaining(t8q) == 2 and g.remaining(t4q) == 4
    d.mdev_create("0000:08:00.4", t4q.type_id, U1.encode() + b"\n")
    assert g.remaining(t8q) == 0 and g.remaining(t4c) == 3
    assert g.available(0, t4c) == 0 and g.available(1, t4c) == 1
    assert errno_of(d.mdev_create, "0000:08:00.5", t8q.type_id, U2.encode()) == errno.EINVAL
    d.mdev_remove(U1, b"1")
    assert g.remaining(t8q) == 2


def test_mdev_errnos() -> None:
    d = a2(vgpus=f"[{{type: A2-4Q, uuid: {U1}, vf: 0, in-use: vm a/b}}]")
    tid = 746
    assert errno_of(d.mdev_create, "0000:08:00.5", tid, b"short") == errno.EINVAL
    assert errno_of(d.mdev_create, "0000:08:00.5", tid, b"z" * 36) == errno.EINVAL
    assert errno_of(d.mdev_create, "0000:08:00.5", tid, U1.upper().encode()) == errno.EEXIST
    assert errno_of(d.mdev_remove, U1, b"x") == errno.EINVAL
    d.mdev_remove(U1, b"0\n")  # no-op
    assert errno_of(d.mdev_remove, U1, b"1\n") == errno.EBUSY
    assert d.mdev(U1) is not None


def test_create_unavailable_errno_is_configurable() -> None:
    d = a2("driver: {create-unavailable-errno: EUSERS}", f"[{{type: A2-16Q, uuid: {U1}}}]")
    assert errno_of(d.mdev_create, "0000:08:00.5", 746, U2.encode()) == errno.EUSERS


def test_pf_parent_counts_on_non_sriov_gpu() -> None:
    d = SimDriver(
        parse_spec('gpus: [{address: "0000:3b:00.0", model: T4}]', catalog=CATALOG), catalog=CATALOG
    )
    g = d.gpus[0]
    t = g.model.type("T4-4Q")
    assert t is not None and g.numvfs == 0
    assert g.available(None, t) == 4
    d.mdev_create("0000:3b:00.0", t.type_id, U1.encode())
    assert g.available(None, t) == 3


def test_vendor_vfio_errnos_and_catalog_text() -> None:
    d = SimDriver(
        parse_spec(
            "driver: {flavour: graphics}\n"
            'gpus: [{address: "0000:26:00.0", model: L40S, layout: vendor-vfio}]',
            catalog=CATALOG,
        ),
        catalog=CATALOG,
    )
    g = d.gpus[0]
    vf0 = g.vf_addresses()[0]
    text = creatable_text(g, 0)
    assert text.startswith("ID    : vGPU Name\n1145  : NVIDIA L40S-1B\n")
    assert "2164  : NVIDIA L40S-3B\n" in text and "C\n" not in text
    assert errno_of(d.vf_type_write, vf0, b"abc") == errno.EINVAL
    assert errno_of(d.vf_type_write, vf0, b"50106") == errno.EIO  # compute type, graphics flavour
    d.vf_type_write(vf0, b"0")  # clearing a free VF succeeds
    d.vf_type_write(vf0, b"1156\n")  # L40S-48Q: the whole GPU
    assert creatable_text(g, 0) == "ID    : vGPU Name\n"
    assert creatable_text(g, 1) == "ID    : vGPU Name\n"
    assert errno_of(d.vf_type_write, vf0, b"1150") == errno.EBUSY
    assert errno_of(d.vf_type_write, g.vf_addresses()[1], b"1150") == errno.EIO


def test_sriov_numvfs_and_sriov_manage() -> None:
    d = a2(vgpus=f"[{{type: A2-4Q, uuid: {U1}, vf: 0, in-use: vm a/b}}, {{type: A2-4Q, vf: 1}}]")
    pf = "0000:08:00.0"
    assert errno_of(d.sriov_numvfs_write, pf, b"17") == errno.ERANGE
    assert errno_of(d.sriov_numvfs_write, pf, b"x") == errno.EINVAL
    d.sriov_numvfs_write(pf, b"16")  # unchanged: no-op
    assert errno_of(d.sriov_numvfs_write, pf, b"0") == errno.ENOENT  # PF bound to nvidia
    assert d.sriov_manage(f"-e {pf}") == (0, f"GPU at {pf} already has VFs enabled.")
    status, out = d.sriov_manage(f"-d {pf}")
    assert status == 1 and "unbindLock" in out and d.gpus[0].numvfs == 16
    d.gpus[0].vgpus[0].in_use = None
    assert d.sriov_manage(f"-d {pf}")[0] == 0
    assert d.gpus[0].numvfs == 0 and d.gpus[0].vgpus == []
    assert d.sriov_manage("-e ALL")[0] == 0 and d.gpus[0].numvfs == 16
    assert d.sriov_manage("-x")[0] == 2


def test_sriov_numvfs_on_pf_without_nvidia_driver() -> None:
    d = SimDriver(
        parse_spec(
            'gpus: [{address: "0000:08:00.0", model: A2, sriov: false, driver: vfio-pci}]',
            catalog=CATALOG,
        ),
        catalog=CATALOG,
    )
    pf = "0000:08:00.0"
    d.sriov_numvfs_write(pf, b"4")
    assert d.gpus[0].numvfs == 4
    assert errno_of(d.sriov_numvfs_write, pf, b"8") == errno.EBUSY


def test_faults_fail_nth_write_and_persist_what_is_left() -> None:
    spec = parse_spec(
        'gpus: [{address: "0000:3b:00.0", model: T4}]\n'
        "faults: [{op: create, nth: 2, errno: EIO}, {op: remove, nth: 5, errno: EBUSY}]",
        catalog=CATALOG,
    )
    s = SimSysfs(spec, catalog=CATALOG)
    create = "bus/pci/devices/0000:3b:00.0/mdev_supported_types/nvidia-232/create"
    s.write(create, U1.encode())
    with pytest.raises(OSError) as info:
        s.write(create, U2.encode())
    assert info.value.errno == errno.EIO
    s.write(create, U2.encode())
    s.write(f"bus/mdev/devices/{U1}/remove", b"1")
    left = s.to_spec().faults
    assert len(left) == 1 and left[0].op == "remove" and left[0].nth == 4


def test_fault_path_glob() -> None:
    spec = parse_spec(
        'gpus: [{address: "0000:3b:00.0", model: T4}]\n'
        'faults: [{op: any, errno: EAGAIN, path: "*nvidia-233/create"}]',
        catalog=CATALOG,
    )
    s = SimSysfs(spec, catalog=CATALOG)
    s.write("bus/pci/devices/0000:3b:00.0/mdev_supported_types/nvidia-232/create", U1.encode())
    with pytest.raises(OSError) as info:
        s.write("bus/pci/devices/0000:3b:00.0/mdev_supported_types/nvidia-233/create", U2.encode())
    assert info.value.errno == errno.EAGAIN


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('gpus: [{address: "0000:08:00.0", model: A3}]', "did you mean"),
        ('gpus: [{address: "08:00.0", model: A2, bogus: 1}]', "Extra inputs"),
        ('gpus: [{address: "nope", model: A2}]', "not a PCI address"),
        ('gpus: [{address: "0000:3b:00.0", model: T4, layout: vendor-vfio}]', "no SR-IOV"),
        ('gpus: [{address: "0000:08:00.0", model: A2, vgpus: [{type: T4-1Q}]}]', "no vGPU type"),
        (
            'gpus: [{address: "0000:08:00.0", model: A2, vgpus: [{type: A2-4Q}, {type: A2-8Q}]}]',
            "share one framebuffer size",
        ),
        ('gpus: [{address: "0000:08:00.0", model: A2, vgpus: [{type: A2-4Q, vf: 16}]}]', "VF 16"),
        ("faults: [{op: create, errno: ENOPE}]", "errno name"),
        (
            "driver: {flavour: compute}\n"
            'gpus: [{address: "0000:08:00.0", model: A2, vgpus: [{type: A2-4Q}]}]',
            "flavour",
        ),
    ],
)
def test_spec_errors_are_clear(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        SimDriver(parse_spec(text, "node.yaml", catalog=CATALOG), catalog=CATALOG)
    assert message in str(info.value)


def test_spec_round_trip() -> None:
    d = a2(
        "labels: {a: b}", f"[{{type: A2-4Q, uuid: {U1}, vf: 3, in-use: vm x/y}}, {{type: A2-4C}}]"
    )
    spec = d.to_spec()
    again = SimDriver(parse_spec(dump_spec(spec), catalog=CATALOG), catalog=CATALOG)
    assert again.to_spec() == spec
    first = again.gpus[0].vgpus[0]
    assert (first.vf, first.uuid, first.in_use) == (3, U1, "vm x/y")
