"""The simulated node's spec file (YAML): GPUs, existing vGPUs, driver flavour, faults."""

from __future__ import annotations

import contextlib
import errno as errno_mod
import io
import os
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from ruamel.yaml import YAML
from ruamel.yaml.constructor import ConstructorError, SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vgpu_state.catalog import Catalog, parse_type_name, suggest
from vgpu_state.config.yamlnodes import YamlProblem, compose_text, safe_yaml
from vgpu_state.inputfiles import InputFileError, decode_utf8, read_input
from vgpu_state.model.errors import VgpuStateError
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.pci import parse_pci_address


class SpecError(VgpuStateError):
    """The simulator spec is invalid; the message names the file and the field."""


class _Spec(Frozen):
    model_config = ConfigDict(populate_by_name=True)


class VgpuSpec(_Spec):
    type: str
    uuid: str | None = None
    """mdev layout: the mdev UUID (derived from node, GPU and slot when omitted)."""
    vf: int | None = None
    """SR-IOV GPUs: the VF index holding the vGPU (lowest free VF when omitted)."""
    in_use: str | None = Field(default=None, alias="in-use")
    """Who holds the vGPU (e.g. ``vm default/win-1``); removing it fails with EBUSY."""
    gpu_instance: int | None = Field(default=None, alias="gpu-instance", ge=0, le=1023)
    """MIG-backed type: the id of the GPU instance holding it (the driver's choice when
    omitted: the lowest id with room)."""
    placement: int | None = Field(default=None, ge=0, le=1023)
    """Mixed-size mode: the first slot the vGPU occupies (the lowest free one when omitted)."""


class GpuInstanceSpec(_Spec):
    """A MIG GPU instance given with its id (and placement) instead of by profile name alone."""

    profile: str
    id: int | None = Field(default=None, ge=1, le=1023)
    placement: int | None = Field(default=None, ge=0, le=63)
    """The first compute slice it occupies (the lowest free aligned one when omitted)."""


class GpuSpec(_Spec):
    address: str
    model: str
    layout: Literal["mdev", "vendor-vfio"] = "mdev"
    sriov: bool = True
    driver: str = "nvidia"
    """The PF's driver; anything but ``nvidia`` makes the GPU unavailable for vGPUs."""
    numa_node: int = Field(default=0, alias="numa-node")
    iommu_group: int | None = Field(default=None, alias="iommu-group")
    vf_iommu_group_base: int | None = Field(default=None, alias="vf-iommu-group-base")
    vgpus: tuple[VgpuSpec, ...] = ()
    mig_mode: bool = Field(default=False, alias="mig-mode")
    """MIG mode (only for a model with MIG-backed types): only MIG-backed types are offered."""
    gpu_instances: tuple[str | GpuInstanceSpec, ...] = Field(default=(), alias="gpu-instances")
    """MIG GPU instances by profile name (``1g.24gb``); needs MIG mode and the VFs enabled
    (``sriov-manage -e`` destroys every GPU instance, so these are the ones created after)."""
    heterogeneous: bool = False
    """The driver's mixed-size (heterogeneous) vGPU mode; needs the vendor-vfio layout
    with SR-IOV on, and MIG mode off."""

    @field_validator("gpu_instances", mode="before")
    @classmethod
    def _no_gpu_instances(cls, v: object) -> object:
        return () if v is None else v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return parse_pci_address(v)

    @field_validator("vgpus", mode="before")
    @classmethod
    def _no_vgpus(cls, v: object) -> object:
        return () if v is None else v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str, info: ValidationInfo) -> str:
        catalog = _context_catalog(info)
        return _check_model(v, catalog) if catalog is not None else v


def _context_catalog(info: ValidationInfo) -> Catalog | None:
    """The catalog :func:`parse_spec` validates with. A spec built in code has none;
    the simulated driver checks its models when it is built (with its own catalog)."""
    found = info.context.get("catalog") if isinstance(info.context, dict) else None
    return found if isinstance(found, Catalog) else None


def _check_model(v: str, catalog: Catalog) -> str:
    shared = _shared_device_id(v, catalog)
    if shared:
        raise ValueError(shared)
    if catalog.find_model(v) is None:
        names = [m.short_name for m in catalog.models] + [m.name for m in catalog.models]
        found = suggest(v, names)
        hint = f"; did you mean {found!r}?" if found else ""
        raise ValueError(f"unknown GPU model {v!r}{hint}")
    return v


class DriverTypeSpec(_Spec):
    """A vGPU type this simulated driver offers beyond the catalog (a newer driver's type)."""

    name: str
    id: int = Field(ge=1)
    """The type id (``mdev_supported_types/nvidia-<id>``, ``creatable_vgpu_types``)."""
    framebuffer_mib: int = Field(alias="framebuffer-mib", ge=512)
    max_instances: int = Field(alias="max-instances", ge=1)
    model: str | None = None
    """The GPU model that offers it; by default the model whose type names share the
    name's product part (``L40S`` for ``L40S-5Q``)."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        parsed = parse_type_name(v)
        if parsed is None or v != v.strip() or " " in v:
            raise ValueError(f"{v!r} is not a vGPU type name such as L40S-5Q")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None, info: ValidationInfo) -> str | None:
        catalog = _context_catalog(info)
        return _check_model(v, catalog) if v is not None and catalog is not None else v


class DriverSpec(_Spec):
    flavour: Literal["graphics", "compute", "all"] = "all"
    extra_types: tuple[DriverTypeSpec, ...] = Field(default=(), alias="extra-types")
    """Types the driver offers that the catalog does not know (a newer driver)."""
    create_unavailable_errno: str = Field(default="EINVAL", alias="create-unavailable-errno")
    """errno of an mdev ``create`` whose type is not available (EINVAL or EUSERS)."""

    @field_validator("create_unavailable_errno")
    @classmethod
    def _errno(cls, v: str) -> str:
        return check_errno_name(v)


class FaultSpec(_Spec):
    op: Literal["create", "remove", "set-type", "clear-type", "sriov", "nvidia-smi", "any"] = "any"
    nth: int | None = Field(default=None, ge=1)
    """Fail only the Nth matching write (1-based); every matching write when omitted."""
    errno: str | None = None
    delay_ms: int = Field(default=0, alias="delay-ms", ge=0)
    path: str | None = None
    """A glob matched against the path below the sysfs root (e.g. ``bus/mdev/*``)."""

    @field_validator("errno")
    @classmethod
    def _errno(cls, v: str | None) -> str | None:
        return None if v is None else check_errno_name(v)


class NodeSpec(_Spec):
    node: str = "sim-node"
    labels: dict[str, str] = Field(default_factory=dict)
    driver: DriverSpec = DriverSpec()
    sriov_manage: bool = Field(default=True, alias="sriov-manage")
    nvidia_smi: bool = Field(default=False, alias="nvidia-smi")
    """Whether the node has ``nvidia-smi`` (the simulator's stand-in): the engine reads
    and changes MIG and mixed-size mode with it."""
    gpus: tuple[GpuSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    extra_pci_devices: int = Field(default=0, alias="extra-pci-devices", ge=0, le=4096)


def _shared_device_id(text: str, catalog: Catalog) -> str | None:
    """What to say when ``text`` is a PCI device id that more than one model has."""
    wanted = text.strip().lower()
    if not wanted.startswith("0x"):
        return None
    try:
        device_id = int(wanted, 16)
    except ValueError:
        return None
    models = catalog.models_for_device(device_id)
    if len(models) < 2:
        return None
    names = [m.short_name for m in models]
    choices = " or ".join(f"model: {n}" for n in names)
    return (
        f"{text} is the device id of {' and '.join(names)}; they differ only in their "
        f"subsystem id, so name the model instead ({choices})"
    )


def check_errno_name(name: str) -> str:
    upper = name.strip().upper()
    if not hasattr(errno_mod, upper) or not upper.startswith("E"):
        raise ValueError(f"{name!r} is not an errno name such as EBUSY, EINVAL or EIO")
    return upper


def errno_value(name: str) -> int:
    value = getattr(errno_mod, name)
    assert isinstance(value, int)
    return value


def _yaml() -> YAML:
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    y.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    return y


class _SpecConstructor(SafeConstructor):
    """The safe constructor, with a YAML 1.1 float lacking the dot of its mantissa
    (``1e3`` under ``%YAML 1.1``) an error instead of ruamel's warning."""

    def construct_yaml_float(self, node: ScalarNode) -> float:
        text = str(node.value).replace("_", "").lower().lstrip("+-")
        mantissa = text.split("e")[0]
        if self.resolver.processing_version != (1, 2) and "e" in text and "." not in mantissa:
            raise ConstructorError(
                problem=f"under %YAML 1.1 the float {node.value!r} needs a dot in its "
                "mantissa (such as 1.0e3)",
                problem_mark=node.start_mark,
            )
        value: float = super().construct_yaml_float(node)
        return value


_SpecConstructor.add_constructor("tag:yaml.org,2002:float", _SpecConstructor.construct_yaml_float)


def _loader() -> YAML:
    """The safe loader, with ruamel's C parser when it is installed (about 10x faster)."""
    yaml = safe_yaml(pure=False)
    yaml.Constructor = _SpecConstructor
    return yaml


MAX_SPEC_BYTES = 4 * 1024 * 1024
"""The largest spec file read (a node with 8 GPUs × 32 vGPUs is about 10 KiB)."""
MAX_SPEC_NODES = 200_000
"""YAML aliases may repeat a subtree; the spec is refused when the expanded tree has
more nodes than this, so an alias bomb cannot make loading take forever."""


def _expanded_size(root: Node) -> int:
    """The number of nodes ``root`` has with every alias expanded (memoised by node)."""
    sizes: dict[int, int] = {}

    def size(node: Node, depth: int) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if depth > 200:
            return MAX_SPEC_NODES + 1
        total = 1
        if isinstance(node, SequenceNode):
            for child in node.value:
                total += size(child, depth + 1)
                if total > MAX_SPEC_NODES:
                    break
        elif isinstance(node, MappingNode):
            for key, value in node.value:
                total += size(key, depth + 1) + size(value, depth + 1)
                if total > MAX_SPEC_NODES:
                    break
        sizes[id(node)] = total
        return total

    return size(root, 0)


def parse_spec(text: str, source: str = "<spec>", *, catalog: Catalog) -> NodeSpec:
    """Read a node spec; ``catalog`` holds the GPU models a spec may name."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: larger than {MAX_SPEC_BYTES // 2**20} MiB: not a node spec")
    try:
        root = compose_text(text)
    except YamlProblem as e:
        raise SpecError(f"{source}:{e.line}:{e.column}: {e.message}") from None
    try:
        if root is not None and _expanded_size(root) > MAX_SPEC_NODES:
            raise SpecError(
                f"{source}: the spec expands to more than {MAX_SPEC_NODES} YAML nodes "
                "(aliases repeat subtrees); refusing it"
            )
        data = _loader().load(text)
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f":{int(mark.line) + 1}:{int(mark.column) + 1}" if mark else ""
        problem = ", ".join(p for p in (e.context, e.problem) if p) or "syntax error"
        raise SpecError(f"{source}{where}: not valid YAML: {problem}") from e
    except YAMLError as e:
        raise SpecError(f"{source}: not valid YAML: {e}") from e
    except (ValueError, RecursionError) as e:
        raise SpecError(f"{source}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with 'node' and 'gpus'")
    try:
        return NodeSpec.model_validate(data, context={"catalog": catalog})
    except ValidationError as e:
        root = _loader().compose(text)
        lines = []
        for err in e.errors():
            loc = tuple(err["loc"])
            where = ".".join(str(p) for p in loc)
            line, column = _position(root, loc, key=err["type"] == "extra_forbidden")
            value = "" if err["type"] == "missing" else f" (found {_short(err['input'])})"
            message = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{source}:{line}:{column}: {where}: {message}{value}")
        raise SpecError("\n".join(lines)) from e


def _short(value: object) -> str:
    """A value for a message: its repr, cut to 80 characters (never the whole of a big one)."""
    if isinstance(value, dict | list | tuple):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _position(root: Node | None, loc: tuple[int | str, ...], key: bool) -> tuple[int, int]:
    """1-based line and column of the YAML value at ``loc`` (of its key with ``key``)."""
    node = root
    mark = root.start_mark if root is not None else None
    for part in loc:
        if isinstance(node, MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == part), None)
            if match is None:
                break
            mark, node = match[0].start_mark, match[1]
            if part != loc[-1] or not key:
                mark = node.start_mark
        elif isinstance(node, SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
        else:
            break
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def load_spec(path: str | Path, *, catalog: Catalog) -> NodeSpec:
    """The spec in the file at ``path`` (without the writes logged since it was saved:
    :func:`vgpu_state.sim.writelog.load_node` replays those)."""
    return read_spec(path, catalog=catalog)[0]


def read_spec(path: str | Path, *, catalog: Catalog) -> tuple[NodeSpec, bytes]:
    """The spec in the file at ``path`` and the file's bytes, read once."""
    p = Path(path)
    try:
        data = read_input(str(p), MAX_SPEC_BYTES, "node spec")
        text = decode_utf8(data, str(p), "node spec")
    except InputFileError as e:
        raise SpecError(str(e)) from None
    return parse_spec(text, str(p), catalog=catalog), data


def dump_spec(spec: NodeSpec) -> str:
    data = {"node": spec.node}
    data.update(spec.model_dump(mode="json", by_alias=True, exclude_defaults=True))
    out = io.StringIO()
    _yaml().dump(data, out)
    return out.getvalue()


def save_spec(spec: NodeSpec, path: str | Path) -> bytes:
    """Write ``spec`` to ``path`` atomically; returns the bytes written.

    The new text goes to a fresh temporary file beside ``path`` (created with
    ``O_CREAT|O_EXCL``, never through a symlink), is fsynced, then renamed over
    ``path``.
    """
    p = Path(path)
    data = dump_spec(spec).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return data
