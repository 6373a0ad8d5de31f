"""``doctor``: what a scan says about whether a host can run vGPUs, in plain sentences.

Pure: it reads a :class:`NodeSnapshot` (and, when a config was checked, its
plan) and returns checks. Each check is ``ok``, ``warn`` or ``fail`` with one
sentence and, when something is to be done, what to do. It claims only what
sysfs shows; what sysfs cannot show (GSP firmware, open kernel modules) is
listed as unknown instead of guessed.
"""

from __future__ import annotations

import re
from enum import StrEnum

from vgpu_state.catalog import Catalog, GpuModel, parse_type_name
from vgpu_state.catalog.mig import mig_capable, mixed_size_capable
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.plan import Plan
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface
from vgpu_state.planner.support import host_modes

SRIOV_MANAGE_HINT = "pass --sriov-manage PATH or install the vGPU Manager's sriov-manage"
NVIDIA_SMI_HINT = "pass --nvidia-smi PATH (or install the vGPU Manager's nvidia-smi)"
INFERRED = "experimental: inferred, not verified on hardware"


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


_RANK = {Status.OK: 0, Status.WARN: 1, Status.FAIL: 2}


def worst(statuses: list[Status]) -> Status:
    return max(statuses, key=_RANK.__getitem__, default=Status.OK)


class Check(Frozen):
    """One finding: what was checked, how it went, one sentence, what to do."""

    id: str
    status: Status
    message: str
    action: str = ""
    """What to do about it; empty when nothing is to be done."""


class Unverifiable(Frozen):
    """Something that matters for vGPU but that sysfs does not show."""

    id: str
    message: str


class GpuReport(Frozen):
    address: str
    index: int
    model: str | None
    device_id: str
    status: Status
    checks: tuple[Check, ...]


class DoctorReport(Frozen):
    node: str
    sysfs_root: str
    status: Status
    """The worst status of every check: ``fail`` makes ``doctor`` exit 1."""
    checks: tuple[Check, ...]
    """Checks of the node as a whole (reading sysfs, the config)."""
    gpus: tuple[GpuReport, ...]
    unknown: tuple[Unverifiable, ...]

    def counts(self) -> dict[str, int]:
        all_checks = [*self.checks, *(c for g in self.gpus for c in g.checks)]
        return {s.value: sum(1 for c in all_checks if c.status is s) for s in Status}


class SriovTool(Frozen):
    """The command that enables SR-IOV VFs on this node, as the settings name it.

    ``command`` empty: VFs are enabled by writing ``sriov_numvfs`` directly.
    ``found``: the command exists and can be run.
    """

    command: str
    found: bool
    missing: str = ""
    """With ``command`` empty: the default command that was looked for and is not installed."""


class SmiTool(Frozen):
    """The nvidia-smi that reads and changes MIG and mixed-size mode on this node.

    ``command`` empty: none (``missing`` names what was looked for).
    """

    command: str
    found: bool
    missing: str = ""


UNKNOWNS = (
    Unverifiable(
        id="gsp",
        message="GSP firmware and open kernel modules: not visible in sysfs, so not checked "
        "here (the NVIDIA driver's own tools report them)",
    ),
)

_SERIES = {
    "Q": "Q (virtual workstation)",
    "B": "B (virtual PC)",
    "A": "A (virtual apps)",
    "C": "C (compute)",
}


def _catalog(gpu: Gpu) -> Check:
    ids = f"device 0x{gpu.device_id:04x}, subsystem 0x{gpu.subsystem_device_id:04x}"
    if gpu.model is not None:
        return Check(
            id="catalog", status=Status.OK, message=f"{gpu.model} ({ids}) is in the vGPU catalog"
        )
    return Check(
        id="catalog",
        status=Status.WARN,
        message=f"unknown GPU ({ids}): not in the vGPU catalog, so it may not support vGPU; "
        "the types its driver lists are still used",
        action="check NVIDIA's list of GPUs supported by your vGPU release",
    )


def _driver(gpu: Gpu) -> Check:
    if gpu.driver == "nvidia":
        return Check(
            id="driver",
            status=Status.OK,
            message="bound to nvidia, the driver the vGPU Manager installs",
        )
    if gpu.driver == "vfio-pci":
        return Check(
            id="driver",
            status=Status.FAIL,
            message="bound to vfio-pci: the GPU is set up for whole-GPU passthrough to one VM, "
            "so it offers no vGPUs",
            action="to use vGPUs, unbind it from vfio-pci and let the nvidia vGPU Manager "
            "driver take it",
        )
    if gpu.driver is None:
        return Check(
            id="driver",
            status=Status.FAIL,
            message="not bound to any driver: the nvidia driver is not loaded or did not take "
            "this GPU",
            action="install the NVIDIA vGPU Manager and load its nvidia module",
        )
    return Check(
        id="driver",
        status=Status.FAIL,
        message=f"bound to {gpu.driver}, not to nvidia: vGPUs need the NVIDIA vGPU Manager's "
        "nvidia driver",
        action=f"unbind it from {gpu.driver} and install the NVIDIA vGPU Manager",
    )


def _interface(gpu: Gpu) -> Check:
    layout = gpu.layout
    if layout is SysfsInterface.MDEV:
        where = "its SR-IOV VFs" if "VFs" in gpu.layout_reason else "the GPU itself (PF)"
        return Check(
            id="interface",
            status=Status.OK,
            message=f"mdev: vGPU types are offered as mdev types on {where}",
        )
    if layout is SysfsInterface.VENDOR_VFIO:
        return Check(
            id="interface",
            status=Status.OK,
            message="vendor-specific VFIO: each VF takes a vGPU type through "
            "nvidia/current_vgpu_type",
        )
    if layout is SysfsInterface.SRIOV_DISABLED:
        return Check(
            id="interface",
            status=Status.WARN,
            message="no vGPU interface yet: this GPU's vGPUs live on SR-IOV VFs, which are off; "
            "the mdev or vendor-VFIO interface appears once they are enabled",
            action="enable the VFs (vgpu-state apply does it with sriov-manage -e)",
        )
    if gpu.driver != "nvidia":
        message = (
            f"no vGPU types offered: {gpu.layout_reason}; a GPU in passthrough mode or "
            "without the vGPU Manager's driver offers none"
        )
        action = "bind the GPU to the nvidia vGPU Manager driver"
    else:
        message = (
            f"no vGPU types offered ({gpu.layout_reason}): the host driver is not a vGPU "
            "driver (a data-centre or desktop driver offers none)"
        )
        action = "install the NVIDIA vGPU Manager (host driver) instead of the data-centre driver"
    return Check(id="interface", status=Status.FAIL, message=message, action=action)


def _sriov(gpu: Gpu, tool: SriovTool | None) -> Check:
    total = gpu.sriov_totalvfs
    if not total:
        return Check(
            id="sriov",
            status=Status.OK,
            message="not SR-IOV capable (no sriov_totalvfs): vGPUs are mdevs on the GPU itself",
        )
    enabled = f"{gpu.sriov_numvfs}/{total} VFs enabled"
    if gpu.sriov_numvfs == total:
        return Check(id="sriov", status=Status.OK, message=f"SR-IOV on: {enabled}")
    if gpu.sriov_numvfs:
        return Check(
            id="sriov",
            status=Status.WARN,
            message=f"SR-IOV partly on: {enabled}; sriov-manage -e enables all of them, so "
            "fewer means another tool set sriov_numvfs",
            action="disable and re-enable the VFs with sriov-manage",
        )
    base = f"SR-IOV off: {enabled}; vGPUs on this GPU need them, and apply enables them"
    if tool is None:
        return Check(
            id="sriov",
            status=Status.WARN,
            message=f"{base} (whether sriov-manage is installed was not checked)",
        )
    if not tool.command:
        return Check(
            id="sriov",
            status=Status.WARN,
            message=f"{base} by writing sriov_numvfs"
            + (f" ({tool.missing} is not installed)" if tool.missing else "")
            + ", which the nvidia driver is reported to refuse (sriov-manage is the supported "
            "way)",
            action=SRIOV_MANAGE_HINT,
        )
    if tool.found:
        return Check(id="sriov", status=Status.OK, message=f"{base} with {tool.command} -e")
    return Check(
        id="sriov",
        status=Status.FAIL,
        message=f"{base} with sriov-manage, but {tool.command} is not installed or not executable",
        action=SRIOV_MANAGE_HINT,
    )


def _iommu(gpu: Gpu) -> Check:
    if gpu.iommu_group is None:
        return Check(
            id="iommu",
            status=Status.FAIL,
            message="no IOMMU group: the IOMMU is most likely off (in firmware or on the kernel "
            "command line), and VFIO cannot hand a vGPU to a VM without it",
            action="enable VT-d / AMD-Vi in the firmware and boot with intel_iommu=on "
            "(Intel) or with the AMD IOMMU on",
        )
    missing = [vf.address for vf in gpu.vfs if vf.iommu_group is None]
    if missing:
        return Check(
            id="iommu",
            status=Status.WARN,
            message=f"IOMMU group {gpu.iommu_group}, but {len(missing)} VF(s) have none "
            f"(first: {missing[0]})",
            action="check the kernel log for IOMMU errors",
        )
    return Check(id="iommu", status=Status.OK, message=f"IOMMU group {gpu.iommu_group}")


def _series(gpu: Gpu) -> Check:
    if not gpu.offered:
        return Check(
            id="series",
            status=Status.WARN,
            message="vGPU series offered: unknown (the driver lists no vGPU types for this GPU)",
        )
    found: set[str] = set()
    for t in gpu.offered:
        parsed = parse_type_name(t.name)
        if parsed is not None:
            found.add(parsed.series)
    listed = ", ".join(_SERIES[s] for s in "QBAC" if s in found) or "none recognised"
    graphics = bool(found & {"Q", "B", "A"})
    compute = "C" in found
    complete = gpu.offered_complete
    if graphics and compute:
        flavour = "graphics and compute"
    elif not complete:
        # A partial list shows what is there, not what is missing.
        flavour = "whether it has other series is unknown while the GPU holds vGPUs"
    elif graphics:
        flavour = "graphics only: no C (compute) types, those need the compute (AI Enterprise) "
        flavour += "vGPU driver"
    elif compute:
        flavour = "compute only: no Q/B/A (graphics) types, those need the graphics vGPU driver"
    else:
        flavour = "unknown"
    partial = "" if complete else " (from the types creatable now)"
    return Check(
        id="series",
        status=Status.OK,
        message=f"driver offers {listed}{partial}: {flavour}",
    )


def _problems(gpu: Gpu) -> list[Check]:
    own = f"device 0x{gpu.device_id:04x} subsystem"
    return [
        Check(id="sysfs", status=Status.WARN, message=p)
        for p in gpu.problems
        if not (gpu.model is None and p.startswith(own))
    ]


def _modes(gpu: Gpu) -> list[Check]:
    """A GPU in MIG mode or mixed-size mode whose modes were not read: vgpu-state lays it
    out only once it reads them with nvidia-smi."""
    if gpu.modes is not None:
        return []
    return [
        Check(
            id="mode",
            status=Status.FAIL,
            message=problem,
            action=f"{NVIDIA_SMI_HINT}, or leave this GPU out of every vgpu-state layout; "
            "docs/plan.md, 'GPU modes'",
        )
        for problem in host_modes(gpu)
    ]


def _model(gpu: Gpu, catalog: Catalog | None) -> GpuModel | None:
    """The GPU's catalog model, when there is a catalog and the GPU's model is known."""
    return catalog.model(gpu.model) if catalog is not None and gpu.model else None


def _on(value: bool | None) -> str:
    return "N/A" if value is None else ("on" if value else "off")


def _mig(gpu: Gpu, smi: SmiTool | None) -> Check:
    """MIG capability and state: mode (and a pending change) and the GPU instances."""
    modes = gpu.modes
    if modes is None or modes.mig is None:
        missing = smi is not None and not smi.found
        why = "no nvidia-smi" if missing else "nvidia-smi did not report it"
        return Check(
            id="mig",
            status=Status.WARN,
            message=f"MIG-capable (the catalog lists MIG-backed types); MIG mode and GPU "
            f"instances not read: {why}",
            action=NVIDIA_SMI_HINT if missing else "",
        )
    counts = modes.gi_counts()
    instances = ", ".join(f"{n} × {p}" for p, n in sorted(counts.items())) if counts else "none"
    message = f"MIG-capable; MIG mode {_on(modes.mig)}"
    if modes.mig:
        message += f", GPU instances: {instances} (profiles derived from the catalog: {INFERRED})"
    if modes.mig_pending is not None and modes.mig_pending != modes.mig:
        return Check(
            id="mig",
            status=Status.WARN,
            message=f"{message}; MIG mode turns {_on(modes.mig_pending)} at the next GPU reset",
            action="reset the GPU (or reboot) before laying it out",
        )
    return Check(id="mig", status=Status.OK, message=message)


def _mixed_size(gpu: Gpu, smi: SmiTool | None) -> Check:
    """Mixed-size (heterogeneous) capability and state."""
    modes = gpu.modes
    capable = f"mixed-size capable (its model: Ada, Hopper, Blackwell; {INFERRED})"
    if modes is None:
        missing = smi is not None and not smi.found
        why = "no nvidia-smi" if missing else "nvidia-smi did not report it"
        return Check(
            id="mixed-size",
            status=Status.OK,
            message=f"{capable}; mixed-size mode not read: {why}",
            action=NVIDIA_SMI_HINT if missing else "",
        )
    if modes.heterogeneous is None:
        state = "N/A in MIG mode" if modes.mig else "not reported"
        return Check(
            id="mixed-size", status=Status.OK, message=f"{capable}; mixed-size mode {state}"
        )
    return Check(
        id="mixed-size",
        status=Status.OK,
        message=f"{capable}; mixed-size mode {_on(modes.heterogeneous)}",
    )


def gpu_checks(
    gpu: Gpu,
    sriov_tool: SriovTool | None,
    smi: SmiTool | None = None,
    catalog: Catalog | None = None,
) -> list[Check]:
    """The host checks of one GPU, in a fixed order (MIG capability only with ``catalog``)."""
    modes = []
    model = _model(gpu, catalog)
    if model is not None and mig_capable(model):
        modes.append(_mig(gpu, smi))
    if model is not None and mixed_size_capable(model):
        modes.append(_mixed_size(gpu, smi))
    return [
        _catalog(gpu),
        _driver(gpu),
        _interface(gpu),
        _sriov(gpu, sriov_tool),
        _iommu(gpu),
        _series(gpu),
        *modes,
        *_modes(gpu),
        *_problems(gpu),
    ]


ConfigChecks = tuple[list[Check], dict[str, list[Check]]]
"""Checks of a config: the node's, and each covered GPU's by address."""

_GPU_PREFIX = re.compile(r"^gpu\[(?P<address>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\]")


def config_checks(plan: Plan, warnings: tuple[str, ...]) -> ConfigChecks:
    """Node and per-GPU checks of a config's plan: does its layout fit each GPU it covers?

    Every blocked item is a ``fail``; a covered GPU with none is ``ok``.
    """
    node: list[Check] = [
        Check(
            id="config",
            status=Status.OK,
            message=f"config {plan.selection.config!r} selected ({plan.selection.source})",
        )
    ]
    node += [Check(id="config", status=Status.WARN, message=w) for w in warnings]
    node += [
        Check(id="config", status=Status.FAIL, message=f"{b.address}: {b.reason}")
        for b in plan.blocked
        if not b.gpu
    ]
    per_gpu: dict[str, list[Check]] = {}
    for g in plan.gpus:
        if not g.managed:
            continue
        blocked = plan.gpu_blocked(g.address)
        if blocked:
            per_gpu[g.address] = [
                Check(
                    id="config",
                    status=Status.FAIL,
                    message=f"the config's layout is blocked: {b.address}: {b.reason}",
                    action="change the config, or free what blocks it; vgpu-state plan "
                    "shows the whole plan",
                )
                for b in blocked
            ]
            continue
        steps = plan.gpu_actions(g.address)
        done = "is in place" if not steps else f"fits ({len(steps)} step(s) to apply)"
        per_gpu[g.address] = [
            Check(id="config", status=Status.OK, message=f"the config's layout {done}")
        ]
    return node, per_gpu


_CONFIG_ACTION = (
    "fix the config or the selection (-c NAME, --label KEY=VALUE); "
    "vgpu-state validate shows every error of a config"
)


def config_failure(
    messages: list[str], warnings: tuple[str, ...] = (), action: str = _CONFIG_ACTION
) -> ConfigChecks:
    """A config that could not be read or selected, or whose plan could not be made.

    A message about one GPU (``gpu[ADDRESS]…``) becomes that GPU's check;
    ``warnings`` (heard before the failure) are node-wide ``warn`` checks; ``action``
    says what to do (by default: fix the config or the selection).
    """
    node: list[Check] = [Check(id="config", status=Status.WARN, message=w) for w in warnings]
    per_gpu: dict[str, list[Check]] = {}
    for message in messages:
        check = Check(
            id="config",
            status=Status.FAIL,
            message=message,
            action=action,
        )
        m = _GPU_PREFIX.match(message)
        if m:
            per_gpu.setdefault(m.group("address"), []).append(check)
        else:
            node.append(check)
    return node, per_gpu


def sriov_path(tool: SriovTool) -> Check:
    """Which way this node turns SR-IOV on and off: sriov-manage, or ``sriov_numvfs``."""
    if tool.command and tool.found:
        return Check(
            id="sriov-path",
            status=Status.OK,
            message=f"SR-IOV is turned on and off with {tool.command}",
        )
    if tool.command:
        return Check(
            id="sriov-path",
            status=Status.WARN,
            message=f"SR-IOV would be turned on with {tool.command}, which is not installed "
            "or not executable",
            action=SRIOV_MANAGE_HINT,
        )
    return Check(
        id="sriov-path",
        status=Status.WARN,
        message="SR-IOV is turned on by writing sriov_numvfs"
        + (f" ({tool.missing} is not installed)" if tool.missing else " (--sriov-manage '')")
        + ", which the nvidia driver is reported to refuse; VFs already on are kept",
        action=SRIOV_MANAGE_HINT,
    )


def smi_path(tool: SmiTool) -> Check:
    """Whether this node has the nvidia-smi that reads and changes MIG and mixed-size mode."""
    if tool.command and tool.found:
        return Check(
            id="nvidia-smi",
            status=Status.OK,
            message=f"MIG and mixed-size mode are read and changed with {tool.command}",
        )
    what = tool.command or tool.missing or "nvidia-smi"
    return Check(
        id="nvidia-smi",
        status=Status.WARN,
        message=f"{what} is not installed or not executable: MIG mode, GPU instances and "
        "mixed-size mode can be neither read nor changed",
        action=NVIDIA_SMI_HINT,
    )


def diagnose(
    snapshot: NodeSnapshot,
    sriov_tool: SriovTool | None = None,
    config: ConfigChecks | None = None,
    smi: SmiTool | None = None,
    catalog: Catalog | None = None,
) -> DoctorReport:
    """Every check of ``snapshot``, with the config's checks (see :func:`config_checks`).

    ``smi``: the node's nvidia-smi; a node with a MIG-capable GPU and none gets a
    warning saying how to give it (MIG capability is told by ``catalog``)."""
    node: list[Check] = []
    if snapshot.error is not None:
        node.append(
            Check(
                id="sysfs",
                status=Status.FAIL,
                message=f"the host could not be read: {snapshot.error}",
                action="check --sysfs-root (default /sys)",
            )
        )
    elif not snapshot.gpus:
        node.append(
            Check(
                id="gpus",
                status=Status.FAIL,
                message="no NVIDIA GPUs found in sysfs",
                action="check that the GPUs are installed and visible (lspci)",
            )
        )
    node += [
        Check(id="sysfs", status=Status.WARN, message=p)
        for p in snapshot.problems
        if p != snapshot.error
    ]
    per_gpu_config: dict[str, list[Check]] = {}
    if config is not None:
        node += config[0]
        per_gpu_config = config[1]
    if sriov_tool is not None and any(g.sriov_totalvfs for g in snapshot.gpus):
        node.append(sriov_path(sriov_tool))
    if smi is not None:
        if smi.found and smi.command:
            if any(g.modes is not None for g in snapshot.gpus):
                node.append(smi_path(smi))
        elif any((m := _model(g, catalog)) is not None and mig_capable(m) for g in snapshot.gpus):
            node.append(smi_path(smi))
    gpus: list[GpuReport] = []
    for gpu in snapshot.gpus:
        checks = gpu_checks(gpu, sriov_tool, smi, catalog)
        checks += per_gpu_config.get(gpu.address, [])
        gpus.append(
            GpuReport(
                address=gpu.address,
                index=gpu.index,
                model=gpu.model,
                device_id=f"0x{gpu.device_id:04x}",
                status=worst([c.status for c in checks]),
                checks=tuple(checks),
            )
        )
    status = worst([c.status for c in node] + [g.status for g in gpus])
    return DoctorReport(
        node=snapshot.node,
        sysfs_root=snapshot.sysfs_root,
        status=status,
        checks=tuple(node),
        gpus=tuple(gpus),
        unknown=UNKNOWNS,
    )
