"""The host layer's nvidia-smi: parsing what the tool prints, bounded against a hostile one.

The real tool is absent here: its outputs are written as the driver prints them
(the lines the engine reads), and a small script stands in for a tool that
floods, hangs or prints garbage.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import SysfsHost
from vgpu_state.host.nvidia_smi import (
    MAX_OUTPUT,
    NvidiaSmi,
    command_runner,
    parse_gpu_instances,
    parse_query,
    run_bounded,
    smi_bus,
)
from vgpu_state.model.errors import DeviceBusyError, DriverError, InterfaceMissingError
from vgpu_state.model.gpumode import GpuInstance

CATALOG = default_catalog()

QUERY = """
==============NVSMI LOG==============

Timestamp                                 : Sun Nov 29 03:00:00 2026
Driver Version                            : 580.95.02

Attached GPUs                             : 1
GPU 00000000:3B:00.0
    Product Name                          : NVIDIA RTX PRO 6000 Blackwell Server Edition
    Clocks Event Reasons
        Idle                              : Active
    MIG Mode
        Current                           : Enabled
        Pending                           : Disabled
    MIG Device
        Current                           : N/A
    vGPU Device Capability
        Fractional Multi-vGPU             : Supported
        Heterogenous Multi-vGPU           : Supported
    vGPU Heterogeneous Mode               : N/A
    Temperature
        Current                           : 41 C
"""

LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.24gb          14        1          0:1     |
|   0  MIG 2g.48gb           5        3          2:2     |
+-------------------------------------------------------+
"""


def test_query_reads_the_mig_section_and_the_heterogeneous_line() -> None:
    q = parse_query(QUERY)
    assert (q.mig, q.mig_pending, q.heterogeneous) == (True, False, None)
    off = QUERY.replace("Enabled", "Disabled").replace(": N/A\n    Temperature", ": Enabled\n")
    q = parse_query(off)
    assert (q.mig, q.mig_pending, q.heterogeneous) == (False, False, True)
    # No MIG section at all (a GPU without MIG): nothing is made up from other "Current" lines.
    q = parse_query(QUERY.replace("    MIG Mode\n", "    Other\n"))
    assert q.mig is None and q.mig_pending is None


def test_gpu_instance_table() -> None:
    assert parse_gpu_instances(LGI) == (
        GpuInstance(id=1, profile="1g.24gb", placement_start=0, placement_size=1),
        GpuInstance(id=3, profile="2g.48gb", placement_start=2, placement_size=2),
    )
    assert parse_gpu_instances("No GPU instances found: Not Found") == ()
    assert smi_bus("0000:3b:00.0") == "00000000:3B:00.0"


def test_hostile_outputs_are_bounded() -> None:
    # Rows that do not parse, ids out of range, duplicates and overlong lines are skipped.
    junk = "\n".join(
        [
            "|   0  MIG 1g.24gb          14     9999          0:1     |",
            "|   0  MIG 1g.24gb          14        2         99:1     |",
            "|   0  MIG " + "x" * 5000 + "   14        4          0:1     |",
            "|   0  MIG 1g.24gb          14        1          0:1     |",
            "|   0  MIG 1g.24gb          14        1          1:1     |",
            "| 0 MIG 1g.24gb 14 1 0:1 trailing |",
        ]
    )
    assert [gi.id for gi in parse_gpu_instances(junk)] == [1]
    # Thousands of rows: at most 64 instances are believed.
    many = "\n".join(f"|   0  MIG 1g.5gb  19  {i}  0:1  |" for i in range(1, 5000))
    assert len(parse_gpu_instances(many)) == 64
    # A line of a megabyte is not a MIG line, however it ends.
    q = parse_query("    MIG Mode\n        Current : " + "E" * 1_000_000 + "Enabled\n")
    assert q.mig is None


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-nvidia-smi"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_flooding_tool_is_cut_at_the_cap(tmp_path: Path) -> None:
    flood = _script(tmp_path, "while True:\n    sys.stdout.write('x' * 65536)")
    status, output = run_bounded([flood], timeout=30)
    assert len(output) == MAX_OUTPUT
    assert status != 0  # killed


def test_a_hanging_tool_times_out(tmp_path: Path) -> None:
    hang = _script(tmp_path, "time.sleep(60)")
    with pytest.raises(TimeoutError):
        run_bounded([hang], timeout=0.5)
    tool = NvidiaSmi(command_runner([hang], timeout=0.5))
    with pytest.raises(DriverError) as info:
        tool.set_mig_mode("0000:3b:00.0", True)
    assert info.value.errno == errno.ETIMEDOUT


class _Fake:
    """Answers the read commands from fixed text; changes answer ``status``/``output``."""

    def __init__(self, query: str, status: int = 0, output: str = "") -> None:
        self.query, self.status, self.output = query, status, output
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> tuple[int, str]:
        self.calls.append(list(args))
        if "-q" in args:
            return 0, self.query
        if "-lgi" in args:
            return 0, LGI
        return self.status, self.output


def test_refusals_and_unverified_changes_are_driver_errors() -> None:
    busy = _Fake(
        QUERY, 19, "Unable to enable MIG Mode for GPU 00000000:3B:00.0: In use by another client"
    )
    with pytest.raises(DeviceBusyError) as info:
        NvidiaSmi(busy).set_mig_mode("0000:3b:00.0", False)
    assert info.value.operation == "mig-mode"
    assert "In use by another client" in str(info.value)
    # Exit 0, but the fresh read shows MIG mode still on (pending): not believed.
    quiet = _Fake(QUERY)
    with pytest.raises(DriverError) as info2:
        NvidiaSmi(quiet).set_mig_mode("0000:3b:00.0", False)
    assert info2.value.errno == errno.EIO and "MIG mode reads True" in str(info2.value)
    assert quiet.calls == [
        ["-i", "00000000:3B:00.0", "-mig", "0"],
        ["-q", "-i", "00000000:3B:00.0"],
    ]
    # A created instance must be listed with its profile.
    made = _Fake(
        QUERY,
        0,
        "Successfully created GPU instance ID  3 on GPU  0 using profile MIG 2g.48gb (ID  5)",
    )
    assert NvidiaSmi(made).create_gpu_instance("0000:3b:00.0", "2g.48gb") == 3
    wrong = _Fake(
        QUERY,
        0,
        "Successfully created GPU instance ID  7 on GPU  0 using profile MIG 1g.24gb (ID 14)",
    )
    with pytest.raises(DriverError):
        NvidiaSmi(wrong).create_gpu_instance("0000:3b:00.0", "1g.24gb")
    # Destroying an instance that is still listed afterwards is not believed either.
    with pytest.raises(DriverError):
        NvidiaSmi(_Fake(QUERY)).destroy_gpu_instance("0000:3b:00.0", 1)


def test_no_nvidia_smi_leaves_modes_unread_and_refuses_changes(tmp_path: Path) -> None:
    host = SysfsHost(str(tmp_path), "n", "", catalog=CATALOG, nvidia_smi="")
    with pytest.raises(InterfaceMissingError):
        host.set_heterogeneous_mode("0000:3b:00.0", True)
    missing = SysfsHost(
        str(tmp_path), "n", "", catalog=CATALOG, nvidia_smi=str(tmp_path / "nvidia-smi")
    )
    with pytest.raises(InterfaceMissingError):
        missing.set_mig_mode("0000:3b:00.0", True)
    # An address that is not a PCI address never reaches the tool's command line.
    with pytest.raises(DriverError):
        missing.set_mig_mode("../../etc; reboot", True)
    assert not os.path.exists(tmp_path / "nvidia-smi")
