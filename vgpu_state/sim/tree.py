"""The simulated ``/sys`` as data: every directory, attribute file and symlink.

:func:`render` is a pure function of the driver state. Both frontends serve
this one tree: the directory frontend writes it to disk, the FUSE frontend
answers system calls from it. Paths are relative to the sysfs root.
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache, partial

from vgpu_state.catalog import VgpuType
from vgpu_state.host.holders import SIM_VFIO_DIR
from vgpu_state.model.ids import NVIDIA_VENDOR_ID
from vgpu_state.sim.driver_model import SRIOV_OFFSET, SRIOV_STRIDE, SimDriver, SimGpu, SimVgpu

CONTROL_DIR = ".vgpu-sim"
"""Simulator controls inside the tree (not part of real sysfs)."""
SRIOV_MANAGE_CONTROL = f"{CONTROL_DIR}/sriov-manage"
SRIOV_MANAGE_OUTPUT = f"{CONTROL_DIR}/sriov-manage.out"
NVIDIA_SMI_CONTROL = f"{CONTROL_DIR}/nvidia-smi"
"""Writing ``ARGS`` (words separated by spaces) here runs ``nvidia-smi ARGS``."""
NVIDIA_SMI_OUTPUT = f"{CONTROL_DIR}/nvidia-smi.out"
NVIDIA_SMI_STATUS = f"{CONTROL_DIR}/nvidia-smi.status"
"""The exit status of the last ``nvidia-smi`` written to :data:`NVIDIA_SMI_CONTROL`."""
RESET_CONTROL = f"{CONTROL_DIR}/reset"
"""Writing anything here puts the node back to the spec it was loaded from."""
VFIO_NODES = SIM_VFIO_DIR
"""The VFIO nodes a VM would open (``/dev/vfio/<group>``, ``devices/vfioN``), one per
vGPU: through FUSE a process that opens one holds that vGPU until it closes it."""

_RESOURCE_LINE = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"


@dataclass(frozen=True)
class WriteTarget:
    """What a write to a file means to the driver."""

    kind: str
    """``create`` | ``remove`` | ``current_vgpu_type`` | ``sriov_numvfs`` | ``sriov-manage``
    | ``reset`` (a simulator control) | ``vfio`` (a vGPU's VFIO node; ``device`` is the
    vGPU's key)."""
    device: str = ""
    type_id: int = 0


@dataclass(frozen=True)
class Dir:
    pass


@dataclass(frozen=True)
class File:
    content: bytes | None
    """``None`` for a write-only attribute."""
    mode: int = 0o444
    read_errno: int | None = None
    write: WriteTarget | None = None


@dataclass(frozen=True)
class Link:
    target: str


Entry = Dir | File | Link


@dataclass
class Tree:
    entries: dict[str, Entry] = field(default_factory=dict)
    children: dict[str, dict[str, None]] = field(default_factory=dict)
    """Each directory's names, in the order they were added (a dict: removing one
    costs the same in a directory of any size)."""
    _resolved: dict[str, str | None] = field(default_factory=dict, repr=False, compare=False)
    """Paths already resolved; emptied by every change (see :meth:`changed`)."""

    def changed(self) -> None:
        """Entries were added, replaced or removed: forget what was resolved."""
        if self._resolved:
            self._resolved.clear()

    def _ensure_dir(self, path: str) -> None:
        if path in self.entries:
            return
        self.changed()
        if path:
            parent, _, name = path.rpartition("/")
            self._ensure_dir(parent)
            self.children[parent][name] = None
        self.entries[path] = _DIR
        self.children[path] = {}

    def add(self, path: str, entry: Entry) -> None:
        if not path:
            self._ensure_dir("")  # the root is a directory, and no child of itself
            return
        self.changed()
        if path not in self.entries:
            parent, _, name = path.rpartition("/")
            self._ensure_dir(parent)
            self.children[parent][name] = None
        self.entries[path] = entry
        if isinstance(entry, Dir):
            self.children.setdefault(path, {})

    def copy(self) -> Tree:
        """A copy that later changes to this tree leave alone (entries are immutable)."""
        return Tree(dict(self.entries), {d: dict(names) for d, names in self.children.items()})

    def resolve(self, path: str) -> str | None:
        """``path`` with every symlink followed (as the kernel's path walk does).

        Directories resolved once are remembered until the tree changes, so a
        scan that reads every attribute of a device walks its path once.
        """
        key = path.strip("/")
        if key in self._resolved:
            return self._resolved[key]
        parent, _, name = key.rpartition("/")
        if not name or name in (".", "..") or "//" in key:
            found = self._walk(key)
        else:
            base = self.resolve(parent) if parent else ""
            candidate = None if base is None else (f"{base}/{name}" if base else name)
            entry = None if candidate is None else self.entries.get(candidate)
            if candidate is None or entry is None:
                found = None
            elif isinstance(entry, Link):
                found = self._walk(candidate)
            else:
                found = candidate
        self._resolved[key] = found
        return found

    def _walk(self, path: str) -> str | None:
        parts = [p for p in path.split("/") if p]
        current = ""
        hops = 0
        while parts:
            name = parts.pop(0)
            if name == "..":
                current = posixpath.dirname(current)
                continue
            if name == ".":
                continue
            candidate = f"{current}/{name}" if current else name
            e = self.entries.get(candidate)
            if e is None:
                return None
            if isinstance(e, Link):
                hops += 1
                if hops > 40:
                    return None
                parts = [p for p in e.target.split("/") if p] + parts
                continue
            current = candidate
        return current

    def dir(self, path: str) -> None:
        self.add(path, Dir())

    def file(
        self,
        path: str,
        text: str | None,
        mode: int = 0o444,
        write: WriteTarget | None = None,
        read_errno: int | None = None,
    ) -> None:
        content = None if text is None else text.encode()
        self.add(path, File(content, mode, read_errno, write))

    def link(self, path: str, target_abs: str) -> None:
        """A symlink at ``path`` to ``target_abs`` (both below the root), stored relative."""
        self.add(path, Link(_relative(target_abs, path.rpartition("/")[0])))


def _relative(target: str, start: str) -> str:
    """``posixpath.relpath(target, start)`` for clean relative paths below one root."""
    t = target.split("/") if target else []
    s = start.split("/") if start else []
    common = 0
    for a, b in zip(t, s, strict=False):
        if a != b:
            break
        common += 1
    parts = [".."] * (len(s) - common) + t[common:]
    return "/".join(parts) if parts else "."


_DIR = Dir()


def _hex4(v: int) -> str:
    return f"0x{v:04x}\n"


def bridge_dir(gpu: SimGpu) -> str:
    domain = gpu.address[:4]
    return f"devices/pci{domain}:00/{domain}:00:{3 + gpu.index:02x}.0"


def device_dir(gpu: SimGpu, address: str) -> str:
    return f"{bridge_dir(gpu)}/{address}"


def render(drv: SimDriver) -> Tree:
    """The whole tree of a node (see :class:`Renderer` for the incremental form)."""
    return Renderer().render(drv)


def _gpu_state(g: SimGpu) -> tuple[object, ...]:
    """Everything a GPU's part of the tree depends on; equal state, equal files."""
    return (
        g.layout,
        g.driver,
        g.numvfs,
        g.numa_node,
        g.iommu_group,
        g.vf_iommu_group_base,
        g.flavour,
        tuple(
            (v.type.type_id, v.uuid, v.vf, v.iommu_group, v.in_use, v.gpu_instance, v.placement)
            for v in g.vgpus
        ),
        g.mig_mode,
        g.heterogeneous,
        tuple(g.gpu_instances),
    )


def _node_state(drv: SimDriver) -> tuple[object, ...]:
    return (
        any(g.layout == "mdev" for g in drv.gpus),
        drv.extra_pci_devices,
        drv.sriov_manage_installed,
        drv.sriov_manage_output,
        drv.nvidia_smi_installed,
        drv.nvidia_smi_output,
        drv.nvidia_smi_status,
    )


class Renderer:
    """Renders a node, re-rendering only the GPUs whose state changed since the last call.

    Each GPU's files live in parts of their own (a :class:`Tree` each: its PF,
    each VF's device, each VF's vGPU attributes); the node's tree is their union
    with the node-wide part, kept up to date in place: a changed part swaps its
    own entries, so the work of one render follows the parts that changed, not
    the size of the node. The tree returned is always the same object, changed
    by later renders; :meth:`Tree.copy` keeps a version.

    ``changes``: a set that every render adds the paths it added, replaced or
    removed to (for a frontend that mirrors the tree elsewhere, see
    :func:`vgpu_state.sim.dirtree.materialize`).
    """

    def __init__(self, changes: set[str] | None = None) -> None:
        self._parts: dict[str, tuple[tuple[object, ...], Tree]] = {}
        self._node: tuple[tuple[object, ...], Tree] | None = None
        self._gpus: dict[str, tuple[object, ...]] = {}
        """The state of each GPU at the last render."""
        self._of_gpu: dict[str, set[str]] = {}
        """The keys of each GPU's parts."""
        self._tree = Tree()
        self._holders: dict[str, int] = {}
        """How many parts hold each path (the directories above them are shared)."""
        self.changes = changes

    def render(
        self, drv: SimDriver, gpus: Iterable[SimGpu] | None = None, *, node: bool = True
    ) -> Tree:
        """The tree of ``drv`` now. ``gpus``: the only GPUs whose state may have changed
        since the last render (every GPU when omitted); ``node``: whether the node-wide
        part (SR-IOV tools, extra devices) may have. A write changes one GPU, so its
        render costs that GPU's parts, however many GPUs the node has."""
        if node or self._node is None:
            state = _node_state(drv)
            if self._node is None or self._node[0] != state:
                self._replace("", state, lambda: _render_node(drv))
        for g in drv.gpus if gpus is None else gpus:
            state = _gpu_state(g)
            if self._gpus.get(g.address) == state:
                continue  # nothing of this GPU changed since the last render
            self._gpus[g.address] = state
            parts = _gpu_parts(drv, g)
            keys = {key for key, _, _ in parts}
            for key in [k for k in self._of_gpu.get(g.address, ()) if k not in keys]:
                self._swap(self._parts.pop(key)[1], Tree())
            self._of_gpu[g.address] = keys
            for key, part_state, make in parts:
                self._replace(key, part_state, make)
        return self._tree

    def _replace(self, key: str, state: tuple[object, ...], make: Callable[[], Tree]) -> None:
        cached = self._parts.get(key)
        if cached is not None and cached[0] == state:
            return
        part = make()
        self._swap(cached[1] if cached is not None else None, part)
        self._parts[key] = (state, part)
        if key == "":
            self._node = (state, part)

    def _swap(self, old: Tree | None, new: Tree) -> None:
        """Replace the entries of part ``old`` in the union by those of part ``new``."""
        tree, holders, changes = self._tree, self._holders, self.changes
        tree.changed()
        before = old.entries if old is not None else {}
        for path, entry in new.entries.items():
            if path in before:
                if before[path] != entry:
                    tree.entries[path] = entry
                    if changes is not None:
                        changes.add(path)
                continue
            held = holders.get(path, 0)
            holders[path] = held + 1
            if held and tree.entries[path] == entry:
                continue
            tree.entries[path] = entry
            if changes is not None:
                changes.add(path)
            if held:
                continue
            if isinstance(entry, Dir):
                tree.children.setdefault(path, {})
            if path:
                parent, _, name = path.rpartition("/")
                tree.children.setdefault(parent, {})[name] = None
        for path in before:
            if path in new.entries:
                continue
            held = holders[path] - 1
            if held:
                holders[path] = held
                continue
            del holders[path]
            del tree.entries[path]
            if changes is not None:
                changes.add(path)
            tree.children.pop(path, None)
            if path:
                parent, _, name = path.rpartition("/")
                kept = tree.children.get(parent)
                if kept is not None:
                    kept.pop(name, None)


def _render_node(drv: SimDriver) -> Tree:
    t = Tree()
    t.add("", Dir())
    for d in ("bus/pci/devices", "bus/pci/drivers/nvidia", "class", "kernel/iommu_groups"):
        t.dir(d)
    if any(g.layout == "mdev" for g in drv.gpus):
        t.dir("bus/mdev/devices")
        t.dir("bus/mdev/drivers/nvidia-vgpu-vfio")
        t.dir("class/mdev_bus")
    _render_extra(t, drv.extra_pci_devices)
    t.file(RESET_CONTROL, None, 0o200, WriteTarget("reset"))
    if drv.sriov_manage_installed:
        t.file(SRIOV_MANAGE_CONTROL, None, 0o200, WriteTarget("sriov-manage"))
        t.file(
            SRIOV_MANAGE_OUTPUT, drv.sriov_manage_output + "\n" if drv.sriov_manage_output else ""
        )
    if drv.nvidia_smi_installed:
        t.file(NVIDIA_SMI_CONTROL, None, 0o200, WriteTarget("nvidia-smi"))
        t.file(NVIDIA_SMI_OUTPUT, drv.nvidia_smi_output + "\n" if drv.nvidia_smi_output else "")
        t.file(NVIDIA_SMI_STATUS, f"{drv.nvidia_smi_status}\n")
    return t


def _common_attrs(
    t: Tree, path: str, device: int, sub_vendor: int, sub_device: int, numa: int
) -> None:
    t.file(f"{path}/vendor", _hex4(NVIDIA_VENDOR_ID))
    t.file(f"{path}/device", _hex4(device))
    t.file(f"{path}/class", "0x030200\n")
    t.file(f"{path}/subsystem_vendor", _hex4(sub_vendor))
    t.file(f"{path}/subsystem_device", _hex4(sub_device))
    t.file(f"{path}/numa_node", f"{numa}\n")
    t.file(f"{path}/resource", _RESOURCE_LINE * 13)
    t.file(f"{path}/irq", "0\n")
    config = config_space(NVIDIA_VENDOR_ID, device, 0x030200, sub_vendor, sub_device)
    t.add(f"{path}/config", File(config))


@lru_cache(maxsize=256)
def config_space(vendor: int, device: int, cls: int, sub_vendor: int, sub_device: int) -> bytes:
    """The first 256 bytes of a PCI function's configuration space (type 0 header)."""
    header = bytearray(256)
    header[0:2] = vendor.to_bytes(2, "little")
    header[2:4] = device.to_bytes(2, "little")
    header[9:12] = cls.to_bytes(3, "little")  # programming interface, subclass, class
    header[0x2C:0x2E] = sub_vendor.to_bytes(2, "little")
    header[0x2E:0x30] = sub_device.to_bytes(2, "little")
    return bytes(header)


def _group(t: Tree, path: str, group: int) -> None:
    t.dir(f"kernel/iommu_groups/{group}/devices")
    t.link(f"{path}/iommu_group", f"kernel/iommu_groups/{group}")


def _gpu_parts(
    drv: SimDriver, g: SimGpu
) -> list[tuple[str, tuple[object, ...], Callable[[], Tree]]]:
    """The parts of GPU ``g``'s files: its PF, then each VF's device and its vGPU
    attributes, with what each depends on.

    A write changes one VF's vGPU, and often none of the other VFs' files (at
    most their lists of what can be created): only the parts whose state
    differs are rendered again. What the parts share is worked out once per GPU.
    """
    left = g.remaining_of(g.offered_types())
    pf_state: tuple[object, ...] = (
        _gpu_state(g)
        if g.is_mdev_parent_pf()
        else (g.layout, g.driver, g.numvfs, g.numa_node, g.iommu_group)
    )
    parts: list[tuple[str, tuple[object, ...], Callable[[], Tree]]] = [
        (f"{g.address}/pf", pf_state, partial(_part, _render_pf, g, left))
    ]
    if g.driver != "nvidia":
        return parts
    by_vf = {v.vf: v for v in g.vgpus if v.vf is not None}
    pf = device_dir(g, g.address)
    device_state = (g.layout, g.numa_node, g.vf_iommu_group_base)
    if g.layout == "mdev":
        on_vf: dict[int, list[SimVgpu]] = {}
        for v in g.vgpus:
            if v.vf is not None:
                on_vf.setdefault(v.vf, []).append(v)
        free_left = [(vt, min(n, 1)) for vt, n in left]
        taken_left = [(vt, 0) for vt, _ in left]
        free_counts = tuple((vt.type_id, n) for vt, n in free_left)
        taken_counts = tuple((vt.type_id, n) for vt, n in taken_left)
    else:
        free_list = _creatable_lines(g, tuple(vt for vt, n in left if n > 0))
        held_list = _creatable_lines(g, ())
        placements = _placements(g)
    for i, vf_addr in enumerate(g.vf_addresses()):
        vf = device_dir(g, vf_addr)
        parts.append(
            (f"{g.address}/{i}", device_state, partial(_part, _render_vf, g, i, vf_addr, pf))
        )
        occupant = by_vf.get(i)
        if g.layout == "mdev":
            vf_left = taken_left if occupant is not None else free_left
            mdevs = tuple(
                (v.type.type_id, v.uuid, v.iommu_group, v.in_use) for v in on_vf.get(i, ())
            )
            state: tuple[object, ...] = (
                g.layout,
                g.vf_iommu_group_base,
                taken_counts if occupant is not None else free_counts,
                mdevs,
            )
            make = partial(_part, _render_mdev_parent, g, i, vf_addr, vf, vf_left)
        else:
            held = (
                None
                if occupant is None
                else (
                    occupant.type.type_id,
                    occupant.uuid,
                    occupant.iommu_group,
                    occupant.in_use,
                    occupant.gpu_instance,
                )
            )
            listed = held_list if occupant is not None else free_list
            make = partial(_part, _render_creatable, vf, listed)
            parts.append((f"{g.address}/{i}/listed", (listed,), make))
            placement = placements.get(i) if occupant is not None else None
            state = (g.layout, g.vf_iommu_group_base, held, placement)
            make = partial(_part, _render_vfio_vf, g, i, vf, occupant, vf_addr, placement)
        parts.append((f"{g.address}/{i}/vgpu", state, make))
    return parts


class _Part(Tree):
    """A part's entries alone: the union keeps the directory listings, so a part
    keeps none (a node has thousands of parts)."""

    def _ensure_dir(self, path: str) -> None:
        missing = []
        while path not in self.entries:
            missing.append(path)
            if not path:
                break
            path = path.rpartition("/")[0]
        for p in reversed(missing):  # the outermost first, as Tree adds them
            self.entries[p] = _DIR

    def add(self, path: str, entry: Entry) -> None:
        if path and path not in self.entries:
            self._ensure_dir(path.rpartition("/")[0])
        self.entries[path] = entry if path else _DIR


def _part(render: Callable[..., object], *args: object) -> Tree:
    part = _Part()
    part.add("", Dir())
    render(part, *args)
    return part


def _render_pf(t: Tree, g: SimGpu, left: list[tuple[VgpuType, int]]) -> None:
    pf = device_dir(g, g.address)
    t.dir(pf)
    t.link(f"bus/pci/devices/{g.address}", pf)
    _common_attrs(t, pf, g.device_id, NVIDIA_VENDOR_ID, g.subsystem_device_id, g.numa_node)
    t.file(f"{pf}/reset_method", "flr bus\n")
    if g.driver:
        t.dir(f"bus/pci/drivers/{g.driver}")
        t.link(f"{pf}/driver", f"bus/pci/drivers/{g.driver}")
    _group(t, pf, g.iommu_group)
    if g.sriov_capable:
        t.file(f"{pf}/sriov_totalvfs", f"{g.totalvfs}\n")
        t.file(f"{pf}/sriov_numvfs", f"{g.numvfs}\n", 0o644, WriteTarget("sriov_numvfs", g.address))
        t.file(f"{pf}/sriov_offset", f"{SRIOV_OFFSET}\n")
        t.file(f"{pf}/sriov_stride", f"{SRIOV_STRIDE}\n")
        t.file(f"{pf}/sriov_vf_device", f"{g.device_id:04x}\n")
        t.file(f"{pf}/sriov_drivers_autoprobe", "1\n")
        t.file(f"{pf}/sriov_vf_total_msix", "0\n")
    if g.is_mdev_parent_pf():
        _render_mdev_parent(t, g, None, g.address, pf, left)


def _render_vf(t: Tree, g: SimGpu, i: int, vf_addr: str, pf: str) -> str:
    """VF ``i``'s device directory and PCI attributes; returns its path."""
    vf = device_dir(g, vf_addr)
    t.dir(vf)
    t.link(f"bus/pci/devices/{vf_addr}", vf)
    t.link(f"{pf}/virtfn{i}", vf)
    t.link(f"{vf}/physfn", pf)
    _common_attrs(t, vf, g.device_id, NVIDIA_VENDOR_ID, 0x0000, g.numa_node)
    t.file(f"{vf}/reset_method", "flr\n")
    t.link(f"{vf}/driver", "bus/pci/drivers/nvidia")
    _group(t, vf, g.vf_iommu_group_base + i)
    return vf


def _render_mdev_parent(
    t: Tree,
    g: SimGpu,
    vf: int | None,
    address: str,
    path: str,
    available: list[tuple[VgpuType, int]],
) -> None:
    """``available``: each offered type with its ``available_instances`` on this parent."""
    t.link(f"class/mdev_bus/{address}", path)
    prefix = g.model.mdev_name_prefix
    for vt, count in available:
        d = f"{path}/mdev_supported_types/nvidia-{vt.type_id}"
        t.file(f"{d}/name", f"{prefix} {vt.name}\n")
        t.file(f"{d}/available_instances", f"{count}\n")
        t.file(f"{d}/device_api", "vfio-pci\n")
        t.file(f"{d}/description", _description(vt.series, vt.framebuffer_mib, vt.max_instances))
        t.file(f"{d}/create", None, 0o200, WriteTarget("create", address, vt.type_id))
        t.dir(f"{d}/devices")
    for v in g.vgpus:
        if v.vf == vf and v.uuid is not None:
            _render_mdev(t, v, address, path)


def _render_mdev(t: Tree, v: SimVgpu, parent: str, parent_path: str) -> None:
    assert v.uuid is not None
    m = f"{parent_path}/{v.uuid}"
    type_dir = f"{parent_path}/mdev_supported_types/nvidia-{v.type.type_id}"
    t.dir(m)
    t.link(f"{m}/driver", "bus/mdev/drivers/nvidia-vgpu-vfio")
    _group(t, m, v.iommu_group)
    t.link(f"{m}/mdev_type", type_dir)
    t.file(f"{m}/remove", None, 0o200, WriteTarget("remove", v.uuid))
    t.file(f"{m}/nvidia/vgpu_params", "\n", 0o644)
    t.file(f"{m}/nvidia/vm_name", f"{v.in_use or ''}\n")
    t.link(f"{type_dir}/devices/{v.uuid}", m)
    t.link(f"bus/mdev/devices/{v.uuid}", m)
    _vfio_node(t, f"{VFIO_NODES}/{v.iommu_group}", v.uuid)


def _vfio_node(t: Tree, path: str, key: str) -> None:
    t.file(path, "", 0o600, WriteTarget("vfio", key))


def _description(series: str, fb_mib: int, max_instance: int) -> str:
    """The ``description`` line of §3.1 (heads/frame-rate/resolution per series)."""
    heads, frl, res = {
        "B": (4, 45, "5120x2880"),
        "Q": (4, 60, "7680x4320" if fb_mib >= 2048 else "5120x2880"),
        "A": (1, 60, "1280x1024"),
        "C": (1, 60, "4096x2400"),
    }.get(series, (1, 60, "4096x2400"))
    return (
        f"num_heads={heads}, frl_config={frl}, framebuffer={fb_mib}M, "
        f"max_resolution={res}, max_instance={max_instance}\n"
    )


def creatable_text(g: SimGpu, vf: int) -> str:
    """``creatable_vgpu_types`` of a VF: the header then ``%-6d: NVIDIA <name>`` lines."""
    return _creatable_lines(g, g.creatable_on_vf(vf))


def _creatable_lines(g: SimGpu, types: tuple[VgpuType, ...]) -> str:
    lines = ["ID    : vGPU Name"]
    for vt in sorted(types, key=lambda x: x.type_id):
        lines.append(f"{vt.type_id:<6d}: {g.model.mdev_name_prefix} {vt.name}")
    return "\n".join(lines) + "\n"


def _render_creatable(t: Tree, vf: str, listed: str) -> None:
    """A VF's ``creatable_vgpu_types``: what changes on every free VF of a GPU when
    one of its VFs gets or loses a vGPU."""
    t.file(f"{vf}/nvidia/creatable_vgpu_types", listed)


def _render_vfio_vf(
    t: Tree, g: SimGpu, i: int, vf: str, v: SimVgpu | None, address: str, placement: int | None
) -> None:
    """VF ``i`` at path ``vf``: ``v`` its vGPU (at ``placement``); its
    ``creatable_vgpu_types`` is a part of its own (see :func:`_render_creatable`)."""
    n = f"{vf}/nvidia"
    t.file(
        f"{n}/current_vgpu_type",
        f"{v.type.type_id if v else 0}\n",
        0o644,
        WriteTarget("current_vgpu_type", address),
    )
    if v is None:
        t.file(f"{n}/gpu_instance_id", "", 0o444, read_errno=errno.ENXIO)
        t.file(f"{n}/placement_id", "", 0o444, read_errno=errno.ENXIO)
    else:
        gi = v.gpu_instance if v.gpu_instance is not None else 0
        t.file(f"{n}/gpu_instance_id", f"{gi}\n")
        t.file(f"{n}/placement_id", f"{placement}\n")
    t.file(f"{n}/vgpu_params", "\n", 0o644)
    t.file(f"{n}/warm_update", "0\n", 0o644)
    group = g.vf_iommu_group_base + i
    t.dir(f"{vf}/vfio-dev/vfio{group}")
    if v is not None:
        _vfio_node(t, f"{VFIO_NODES}/{group}", address)
        _vfio_node(t, f"{VFIO_NODES}/devices/vfio{group}", address)


def _placements(g: SimGpu) -> dict[int, int]:
    """The ``placement_id`` of each VF's vGPU: its first slot in mixed-size mode; its
    place among the vGPUs of its GPU instance in MIG mode; else its place among the
    GPU's VF-held vGPUs (in creation order)."""
    found: dict[int, int] = {}
    order = [x for x in g.vgpus if x.vf is not None]
    in_gi: dict[int | None, int] = {}
    for k, x in enumerate(order):
        assert x.vf is not None
        if x.placement is not None:
            found[x.vf] = x.placement
        elif x.gpu_instance is not None:
            found[x.vf] = in_gi.get(x.gpu_instance, 0)
            in_gi[x.gpu_instance] = found[x.vf] + 1
        else:
            found[x.vf] = k
    return found


def _render_extra(t: Tree, count: int) -> None:
    """Unrelated PCI functions (network, storage, bridges) that a scan must skip."""
    for n in range(count):
        bus = 0xC0 + n // 256
        addr = f"0000:{bus:02x}:{(n // 8) % 32:02x}.{n % 8}"
        path = f"devices/pci0000:{bus:02x}/{addr}"
        t.link(f"bus/pci/devices/{addr}", path)
        vendor, cls = ((0x8086, "0x020000"), (0x15B3, "0x020700"), (0x1022, "0x060400"))[n % 3]
        device = 0x1000 + n % 0x100
        t.file(f"{path}/vendor", _hex4(vendor))
        t.file(f"{path}/device", _hex4(device))
        t.file(f"{path}/class", f"{cls}\n")
        t.file(f"{path}/subsystem_vendor", _hex4(vendor))
        t.file(f"{path}/subsystem_device", _hex4(0))
        t.file(f"{path}/numa_node", "-1\n")
        t.file(f"{path}/resource", _RESOURCE_LINE * 13)
        t.file(f"{path}/irq", "0\n")
        t.add(f"{path}/config", File(config_space(vendor, device, int(cls, 16), vendor, 0)))
