"""The simulated node's ``nvidia-smi``: MIG mode, GPU instances and mixed-size mode.

:func:`run` answers the command lines the engine uses (docs/simulator.md lists
them) with the messages and exit codes of the real tool, and refuses what the
driver refuses (reference ``nvidia-sysfs.md`` §4.3, §5.3, §5.4, §6):

* MIG mode cannot change while the GPU's VFs are enabled (19, in use);
* mixed-size mode cannot change while a vGPU exists (19), nor in MIG mode (3);
* a GPU instance needs MIG mode (3), a known profile (2) and room (2);
* a GPU instance holding a vGPU cannot be destroyed (19).

Anything else exits 2 with a usage line. A pure function of the driver state.
"""

from __future__ import annotations

from collections.abc import Sequence

from vgpu_state.catalog.mig import GiProfile
from vgpu_state.host.nvidia_smi import smi_bus
from vgpu_state.model.pci import parse_pci_address
from vgpu_state.sim.driver_model import SimDriver
from vgpu_state.sim.gpu_state import SimGpu, SimGpuInstance

SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
IN_USE = 19

USAGE = (
    "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
    "(simulated nvidia-smi: -q -i BUS | -i BUS -mig 0|1 | mig -lgi -i BUS | "
    "mig -i BUS -cgi PROFILE[,PROFILE] [-C] | mig -i BUS -gi ID -dci|-dgi | "
    "vgpu -i BUS -shm 0|1)"
)

_FLAGS = {"-q", "-lgi", "-C", "-dci", "-dgi"}
_VALUED = {"-i", "-mig", "-cgi", "-gi", "-shm"}
_LONG = {"--query": "-q", "--id": "-i", "--multi-instance-gpu": "-mig"}


def _parse(argv: Sequence[str]) -> tuple[str, dict[str, str]] | None:
    """``(sub-command, options)``; ``None`` when a word is not understood."""
    words = list(argv)
    command = ""
    if words and words[0] in ("mig", "vgpu"):
        command = words.pop(0)
    opts: dict[str, str] = {}
    while words:
        word = words.pop(0)
        if word.startswith("--") and "=" in word:
            word, value = word.split("=", 1)
            words.insert(0, value)
        word = _LONG.get(word, word)
        if word in _FLAGS:
            opts[word] = ""
        elif word in _VALUED and words:
            opts[word] = words.pop(0)
        else:
            return None
    return command, opts


def _gpu(drv: SimDriver, text: str) -> SimGpu | None:
    if text.isdigit() and len(text) < 4:
        index = int(text)
        nvidia = [g for g in drv.gpus if g.driver == "nvidia"]
        return nvidia[index] if index < len(nvidia) else None
    try:
        address = parse_pci_address(text[-12:] if len(text) > 12 else text)
    except ValueError:
        return None
    return drv.gpu(address)


def run(drv: SimDriver, argv: Sequence[str]) -> tuple[int, str]:
    """Run ``nvidia-smi ARGV`` on the simulated driver: ``(exit status, output)``."""
    parsed = _parse(argv)
    if parsed is None or "-i" not in parsed[1]:
        return INVALID_ARGUMENT, USAGE
    command, opts = parsed
    gpu = _gpu(drv, opts["-i"])
    if gpu is None or gpu.driver != "nvidia":
        return NOT_FOUND, "No devices were found"
    keys = set(opts) - {"-i"}
    if command == "" and keys == {"-q"}:
        return SUCCESS, query(gpu)
    if command == "" and keys == {"-mig"} and opts["-mig"] in ("0", "1"):
        return set_mig(drv, gpu, opts["-mig"] == "1")
    if command == "mig" and keys == {"-lgi"}:
        return list_gpu_instances(gpu)
    if command == "mig" and keys in ({"-cgi"}, {"-cgi", "-C"}):
        return create_gpu_instances(drv, gpu, opts["-cgi"].split(","), "-C" in opts)
    if command == "mig" and keys in ({"-gi", "-dci"}, {"-gi", "-dgi"}) and opts["-gi"].isdigit():
        return destroy(drv, gpu, int(opts["-gi"]), compute="-dci" in opts)
    if command == "vgpu" and keys == {"-shm"} and opts["-shm"] in ("0", "1"):
        return set_heterogeneous(drv, gpu, opts["-shm"] == "1")
    return INVALID_ARGUMENT, USAGE


def _state(on: bool | None) -> str:
    return "N/A" if on is None else ("Enabled" if on else "Disabled")


def query(gpu: SimGpu) -> str:
    """``nvidia-smi -q -i BUS``: the lines about this GPU the engine reads."""
    mig = gpu.mig_mode if gpu.mig_capable else None
    hetero = gpu.heterogeneous if gpu.mixed_size_capable and not gpu.mig_mode else None
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        "Driver Version                                    : simulated",
        "",
        "Attached GPUs                                     : 1",
        f"GPU {smi_bus(gpu.address)}",
        f"    Product Name                                  : NVIDIA {gpu.model.name}",
        "    MIG Mode",
        f"        Current                                   : {_state(mig)}",
        f"        Pending                                   : {_state(mig)}",
        "    vGPU Device Capability",
        "        Heterogenous Multi-vGPU                   : "
        + ("Supported" if gpu.mixed_size_capable else "Not Supported"),
        f"    vGPU Heterogeneous Mode                       : {_state(hetero)}",
        "    PCI",
        f"        Bus Id                                    : {smi_bus(gpu.address)}",
        "",
    ]
    return "\n".join(lines)


def set_mig(drv: SimDriver, gpu: SimGpu, enabled: bool) -> tuple[int, str]:
    verb = "enable" if enabled else "disable"
    bus = smi_bus(gpu.address)
    if not gpu.mig_capable:
        return NOT_SUPPORTED, f"Unable to {verb} MIG Mode for GPU {bus}: Not Supported"
    if gpu.mig_mode != enabled:
        if gpu.numvfs > 0 or gpu.vgpus:
            return IN_USE, f"Unable to {verb} MIG Mode for GPU {bus}: In use by another client"
        drv.set_mig_mode(gpu, enabled)
    done = "Enabled" if enabled else "Disabled"
    return SUCCESS, f"{done} MIG Mode for GPU {bus}\nAll done."


def _profile_id(gpu: SimGpu, profile: GiProfile) -> int:
    names = [p.name for p in gpu.gi_profiles()]
    return len(names) - 1 - names.index(profile.name)


def _profile(gpu: SimGpu, text: str) -> GiProfile | None:
    wanted = text.strip().removeprefix("MIG ").strip()
    for p in gpu.gi_profiles():
        if wanted in (p.name, str(_profile_id(gpu, p))):
            return p
    return None


def create_gpu_instances(
    drv: SimDriver, gpu: SimGpu, profiles: list[str], compute: bool
) -> tuple[int, str]:
    out: list[str] = []
    for text in profiles:
        name = text.strip()
        if not gpu.mig_capable or not gpu.mig_mode:
            out.append(
                f"Unable to create a GPU instance on GPU {gpu.index:2d} using profile "
                f"{name}: Not Supported"
            )
            return NOT_SUPPORTED, "\n".join(out)
        profile = _profile(gpu, name)
        if profile is None:
            out.append(f"Unable to find profile {name}")
            return INVALID_ARGUMENT, "\n".join(out)
        start = gpu.gi_room(profile)
        if start is None:
            out.append(
                f"Unable to create a GPU instance on GPU {gpu.index:2d} using profile "
                f"{profile.name}: Insufficient Resources"
            )
            return INVALID_ARGUMENT, "\n".join(out)
        gi = SimGpuInstance(gpu.next_gi_id(), profile, start)
        drv.add_gpu_instance(gpu, gi)
        pid = _profile_id(gpu, profile)
        out.append(
            f"Successfully created GPU instance ID {gi.id:2d} on GPU {gpu.index:2d} using "
            f"profile MIG {profile.name} (ID {pid:2d})"
        )
        if compute:
            out.append(
                f"Successfully created compute instance ID  0 on GPU {gpu.index:2d} GPU "
                f"instance ID {gi.id:2d} using profile MIG {profile.name} (ID {pid:2d})"
            )
    return SUCCESS, "\n".join(out)


def destroy(drv: SimDriver, gpu: SimGpu, gi_id: int, *, compute: bool) -> tuple[int, str]:
    gi = gpu.gpu_instance(gi_id) if gpu.mig_mode else None
    what = "compute instances" if compute else "GPU instance"
    if gi is None:
        return NOT_FOUND, f"Unable to destroy {what} for GPU instance ID {gi_id:2d}: Not Found"
    if any(v.gpu_instance == gi.id for v in gpu.vgpus):
        if compute:
            return IN_USE, (
                f"Unable to destroy compute instance ID  0 from GPU {gpu.index:2d} GPU "
                f"instance ID {gi.id:2d}: In use by another client"
            )
        return IN_USE, (
            f"Unable to destroy GPU instance ID {gi.id:2d} from GPU {gpu.index:2d}: "
            "In use by another client"
        )
    if compute:
        return SUCCESS, (
            f"Successfully destroyed compute instance ID  0 from GPU {gpu.index:2d} GPU "
            f"instance ID {gi.id:2d}"
        )
    drv.remove_gpu_instance(gpu, gi)
    return SUCCESS, f"Successfully destroyed GPU instance ID {gi.id:2d} from GPU {gpu.index:2d}"


def list_gpu_instances(gpu: SimGpu) -> tuple[int, str]:
    """``nvidia-smi mig -lgi -i BUS``: the GPU instances as a table."""
    if not gpu.mig_capable or not gpu.mig_mode:
        return NOT_SUPPORTED, "No GPU instances found: Not Supported"
    if not gpu.gpu_instances:
        return NOT_FOUND, "No GPU instances found: Not Found"
    rule = "+" + "-" * 55 + "+"
    lines = [
        rule,
        "| GPU instances:                                        |",
        "| GPU   Name             Profile  Instance   Placement  |",
        "|                          ID       ID       Start:Size |",
        "|" + "=" * 55 + "|",
    ]
    for gi in gpu.gpu_instances:
        name = f"MIG {gi.profile.name}"
        placement = f"{gi.start}:{gi.profile.slices}"
        lines.append(
            f"| {gpu.index:3d}  {name:<16} {_profile_id(gpu, gi.profile):4d}  "
            f"{gi.id:8d}  {placement:>10}     |"
        )
    lines.append(rule)
    return SUCCESS, "\n".join(lines)


def set_heterogeneous(drv: SimDriver, gpu: SimGpu, enabled: bool) -> tuple[int, str]:
    bus = smi_bus(gpu.address)
    word = "enabled" if enabled else "disabled"
    if not gpu.mixed_size_capable or gpu.mig_mode:
        return NOT_SUPPORTED, f"Unable to set vGPU heterogeneous mode for GPU {bus}: Not Supported"
    if gpu.heterogeneous != enabled:
        if gpu.vgpus:
            return IN_USE, (
                f"Unable to set vGPU heterogeneous mode for GPU {bus}: In use by another client"
            )
        drv.set_heterogeneous(gpu, enabled)
    return SUCCESS, f"Heterogeneous vGPU mode {word} for GPU {bus}"
