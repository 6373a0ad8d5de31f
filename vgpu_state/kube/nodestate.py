"""``VGPUNodeState``: one cluster-scoped object per node, named after it, whose status says
what the node has and how its last reconcile went.

The models here are the schema: ``scripts/gen_crd.py`` turns them into the
CustomResourceDefinition (``schemas/vgpunodestate.crd.yaml``), and every status
vgpu-state writes is ``VGPUNodeStateStatus(...).to_json()``. Status goes through
the ``status`` subresource, so writing it never races a change of the spec.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import gzip
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from vgpu_state.kube.api import ConflictError, JsonObject, KubeApi, path_of, retry_on_conflict
from vgpu_state.kube.errors import ClusterError, ContendedWriteError, NotFoundError
from vgpu_state.kube.liststream import stream_pages
from vgpu_state.model import bounded
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.inuse import holder_vm
from vgpu_state.model.lenient import known_fields
from vgpu_state.model.resources import ResourceNameError, resource_name
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu
from vgpu_state.model.status import ConfigState, PendingSwitch
from vgpu_state.model.timestamps import rfc3339

T = TypeVar("T")

GROUP = "vgpu-state.io"
VERSION = "v1alpha1"
KIND = "VGPUNodeState"
PLURAL = "vgpunodestates"
SINGULAR = "vgpunodestate"
SHORT_NAMES = ("vgpuns",)
API_VERSION = f"{GROUP}/{VERSION}"

ConditionKind = Literal["Synced", "Ready", "Blocked", "Degraded", "KubeletAllocatable"]
AgentModeName = Literal["enforce", "plan-only"]
"""The agent's modes (``--mode``, the node label ``vgpu-state.io/mode``)."""
CONDITION_KINDS: tuple[ConditionKind, ...] = (
    "Synced",
    "Ready",
    "Blocked",
    "Degraded",
    "KubeletAllocatable",
)


# Bounds ----------------------------------------------------------------------------------
# What one status may hold. The CustomResourceDefinition carries them (maxItems, maxLength,
# a CEL rule), so the API server refuses a larger status when it is written; the agent
# never writes one (free text is shortened, a host beyond them is an error naming the
# bound); readers (the controller, ``fleet plan``) may therefore size their memory by them.
MAX_GPUS = 32
"""GPUs per node (the largest servers carry 16 to 20)."""
MAX_VGPUS_PER_GPU = 64
"""vGPUs per GPU (the most any vGPU type allows on one GPU is 48)."""
MAX_VGPUS = 1024
"""vGPUs per node, all GPUs together (16 GPUs of 48 is 768): a CEL rule."""
MAX_RESOURCES = 64
"""Capacity rows (one per vGPU type in use) per node (a GPU model offers at most 43 types)."""
MAX_CONDITIONS = 8
ID_LENGTH = 64
"""An mdev UUID (36 characters) or a PCI address (12)."""
TYPE_LENGTH = 64
"""A driver's vGPU type name (``NVIDIA RTX PRO 6000 Blackwell DC-4-24Q`` is 39)."""
NAME_LENGTH = 253
"""A Kubernetes object name (DNS subdomain); also a resource name's and a holder's bound."""
SHORT_LENGTH = 128
"""Codes, hashes, times, plan ids, GPU models."""
MESSAGE_LENGTH = 4096
"""Free text (condition messages, the selection's reason); longer text is shortened."""
SWITCH_MESSAGE_LENGTH = 1024
"""A pending switch's message; longer text is shortened."""
VM_LENGTH = 63 + 1 + NAME_LENGTH
"""``namespace/name`` of a VirtualMachine: a namespace (a DNS label) and an object name."""
MAX_DEPARTING = 64
"""Types a pending switch names as departing (a GPU offers at most 43)."""
MAX_SNAPSHOT_DATA = 256 * 1024
"""``snapshot.data`` (gzip, base64) characters. A scan of 16 GPUs with 48 VFs, each
listing 43 creatable types, is 44 KiB of it."""


def _clipped(limit: int) -> BeforeValidator:
    """Text longer than ``limit`` characters cut to ``limit``, ending in an ellipsis."""

    def clip(value: Any) -> Any:
        if isinstance(value, str) and len(value) > limit:
            return value[: limit - 1] + "\u2026"
        return value

    return BeforeValidator(clip)


Id = Annotated[str, Field(max_length=ID_LENGTH)]
TypeName = Annotated[str, Field(max_length=TYPE_LENGTH)]
Name = Annotated[str, Field(max_length=NAME_LENGTH)]
Short = Annotated[str, Field(max_length=SHORT_LENGTH)]
Message = Annotated[str, _clipped(MESSAGE_LENGTH), Field(max_length=MESSAGE_LENGTH)]
Holder = Annotated[str, _clipped(NAME_LENGTH), Field(max_length=NAME_LENGTH)]
SwitchMessage = Annotated[
    str, _clipped(SWITCH_MESSAGE_LENGTH), Field(max_length=SWITCH_MESSAGE_LENGTH)
]


class StatusBoundError(ClusterError):
    """This node's status would exceed a bound of the ``VGPUNodeState`` schema (a host
    larger than a status may describe): nothing is written."""


class _Model(Frozen):
    """A frozen model whose JSON keys are camelCase, as Kubernetes writes them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class SelectedConfig(_Model):
    """Which config the node runs and why."""

    name: Name | None = Field(default=None, description="The selected config; absent when none.")
    source: Literal["label", "node-selector", "default", "explicit", "none"] = Field(
        description="What selected it: the node label, a node-selectors rule, the default, "
        "an explicit choice, or nothing."
    )
    reason: Message = Field(description="The selection in words, e.g. the label and its value.")
    document_hash: Short | None = Field(
        default=None, description="sha256 of the config document the selection came from."
    )


class VgpuStatus(_Model):
    id: Id = Field(description="The mdev UUID, or the VF address for vendor-VFIO vGPUs.")
    type: TypeName = Field(description="The vGPU type as the driver names it.")
    resource_name: Name | None = Field(
        default=None, description="The extended resource the device plugin advertises it as."
    )
    holder: Holder | None = Field(default=None, description="The pod or VM holding it, if any.")
    vm: Annotated[str, Field(max_length=VM_LENGTH)] | None = Field(
        default=None,
        description="namespace/name of the VM whose virt-launcher pod holds it, when known.",
    )


class SwitchStatus(_Model):
    """A GPU's pending layout switch."""

    state: Literal["deferred", "planned"] = Field(
        description="deferred: something is in its way; planned: the plan destroys vGPUs "
        "on the GPU and has not run yet (e.g. waiting for a rollout slot)."
    )
    policy: Literal["protect", "ignore", "evacuate"] = Field(
        description="The in-use policy the switch runs under."
    )
    departing: tuple[TypeName, ...] = Field(
        default=(), max_length=MAX_DEPARTING, description="The vGPU types leaving the GPU."
    )
    withheld: int | None = Field(
        default=None,
        ge=0,
        le=MAX_VGPUS_PER_GPU,
        description="Free vGPUs of departing types not offered while the switch is pending "
        "(in-use: evacuate); absent when none.",
    )
    message: SwitchMessage = Field(default="", description="What the switch waits for.")


class GpuStatus(_Model):
    address: Id = Field(description="The GPU's PCI address.")
    model: Short | None = Field(default=None, description="The GPU model, when known.")
    layout: Short = Field(description="mdev, vendor-vfio, sriov-disabled or unavailable.")
    vgpus: tuple[VgpuStatus, ...] = Field(
        default=(), max_length=MAX_VGPUS_PER_GPU, description="The GPU's live vGPUs."
    )
    switch: SwitchStatus | None = Field(
        default=None, description="Present while the GPU's layout switch is pending."
    )


class ResourceCapacity(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.withheld) || self.withheld <= self.free",
                    "message": "withheld vGPUs are free vGPUs: at most free",
                }
            ]
        }
    )

    resource_name: Name
    total: int = Field(ge=0, description="vGPUs of this resource on the node.")
    free: int = Field(ge=0, description="Of those, the ones no pod or VM holds.")
    withheld: int | None = Field(
        default=None,
        ge=0,
        description="Of the free ones, those not offered while their GPU's layout switch is "
        "pending (in-use: evacuate); absent when none.",
    )

    @model_validator(mode="after")
    def _withheld_free(self) -> ResourceCapacity:
        if self.withheld is not None and self.withheld > self.free:
            raise ValueError(f"withheld {self.withheld} is more than free {self.free}")
        return self


class Condition(_Model):
    type: ConditionKind
    status: Literal["True", "False", "Unknown"]
    reason: Short = Field(description="A stable CamelCase code.")
    message: Message = ""
    observed_generation: int = Field(default=0, ge=0)
    last_transition_time: Short = Field(description="When status last changed (RFC 3339).")


class LastApply(_Model):
    plan_id: Short = Field(description="The plan's id (its fingerprint).")
    start: Short = Field(description="When the apply started (RFC 3339).")
    end: Short | None = Field(default=None, description="When it ended; absent while running.")
    result: Literal["running", "success", "failed", "blocked", "no-changes"]
    message: Message = ""


SNAPSHOT_ENCODING: Literal["gzip+base64"] = "gzip+base64"
MAX_SNAPSHOT_BYTES = 4 * 1024 * 1024
"""A reported scan larger than this, decompressed, is refused (16 GPUs with 48 VFs, each
listing 43 creatable types: 2.8 MiB)."""
MAX_SNAPSHOT_OBJECTS = 40_000
"""A reported scan with more JSON objects (``{``) than this is refused before it is
decoded (the scan above: 35,265): what one scan costs a reader to decode is bounded."""
MAX_SNAPSHOT_VALUES = 250_000
"""A reported scan with more list items and object members (``,``) than this is refused
before it is decoded (the scan above: 142,672)."""


class ReportedSnapshot(_Model):
    """The scan a status describes, whole: what ``vgpu-state fleet plan`` plans against.

    ``gpus`` shows the layout for people; this is the planner's input (every
    VF, every type the driver offers or can create), compressed so that a
    status stays small and a list of a thousand nodes stays fast.
    """

    encoding: Literal["gzip+base64"] = Field(
        default=SNAPSHOT_ENCODING, description="How data is encoded: gzip, then base64."
    )
    fingerprint: Short = Field(description="sha256 of the scan's vGPU state, as plans record it.")
    scanned_at: Short = Field(description="When the node's host was scanned (RFC 3339).")
    data: str = Field(
        max_length=MAX_SNAPSHOT_DATA,
        description="The scan as JSON, gzip-compressed, base64-encoded.",
    )


class SnapshotDecodeError(ValueError):
    """A reported scan cannot be read back (bad encoding, truncated, too large, invalid)."""


def encode_snapshot(snapshot: NodeSnapshot, scanned_at: datetime.datetime) -> ReportedSnapshot:
    """``snapshot`` for the status; equal scans give equal text (no gzip timestamp)."""
    raw = snapshot.model_dump_json(exclude_defaults=True).encode()
    where = f"node {snapshot.node}" if snapshot.node else "this node"
    problem = _size_problem(raw)
    if problem is not None:
        raise StatusBoundError(f"{where}: the scan of its host is too large to report: {problem}")
    packed = gzip.compress(raw, compresslevel=6, mtime=0)
    data = base64.b64encode(packed).decode("ascii")
    if len(data) > MAX_SNAPSHOT_DATA:
        raise StatusBoundError(
            f"{where}: the scan of its host is {len(data)} characters compressed; a "
            f"VGPUNodeState status holds at most {MAX_SNAPSHOT_DATA}"
        )
    return ReportedSnapshot(
        fingerprint=snapshot.fingerprint(), scanned_at=rfc3339(scanned_at), data=data
    )


SNAPSHOT_REFRESH = datetime.timedelta(minutes=10)
"""How old ``scannedAt`` may grow before an unchanged scan is written again. A steady
node's status changes (and is written) only this often, and a reader can tell a
node whose agent stopped reporting: its ``scannedAt`` falls behind."""


def parse_time(text: str) -> datetime.datetime | None:
    """An RFC 3339 time as the status holds it (``None`` when it is not one)."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


def reported_snapshot(
    snapshot: NodeSnapshot,
    scanned_at: datetime.datetime,
    previous: ReportedSnapshot | None,
    refresh: datetime.timedelta = SNAPSHOT_REFRESH,
) -> ReportedSnapshot:
    """The status's ``snapshot``: ``previous`` while it holds the same scan and is younger
    than ``refresh`` (so an unchanged host does not change the status), else this scan."""
    new = encode_snapshot(snapshot, scanned_at)
    if previous is not None and (previous.data, previous.fingerprint) == (
        new.data,
        new.fingerprint,
    ):
        before = parse_time(previous.scanned_at)
        if before is not None and datetime.timedelta(0) <= scanned_at - before < refresh:
            return previous
    return new


def decode_snapshot(reported: ReportedSnapshot) -> NodeSnapshot:
    """The scan back from the status. Raises :class:`SnapshotDecodeError` saying what is wrong."""
    return SnapshotDecoder().decode(reported)


def inflate_snapshot(reported: ReportedSnapshot) -> bytes:
    """The scan's JSON text from the status (base64, then gzip, at most
    :data:`MAX_SNAPSHOT_BYTES`). Raises :class:`SnapshotDecodeError`."""
    try:
        # Strict base64 (only the alphabet, padding at the end) in one pass; what it
        # refuses is read as before, which decides.
        packed = binascii.a2b_base64(reported.data, strict_mode=True)
    except (binascii.Error, ValueError):
        try:
            packed = base64.b64decode(reported.data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise SnapshotDecodeError(f"snapshot data is not base64: {e}") from None
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        raw = inflate.decompress(packed, MAX_SNAPSHOT_BYTES + 1)
    except zlib.error as e:
        raise SnapshotDecodeError(f"snapshot data is not gzip: {e}") from None
    if len(raw) > MAX_SNAPSHOT_BYTES or inflate.unconsumed_tail:
        raise SnapshotDecodeError(
            f"snapshot is larger than {MAX_SNAPSHOT_BYTES // (1024 * 1024)} MiB decompressed"
        )
    if not inflate.eof:
        raise SnapshotDecodeError("snapshot data is truncated")
    problem = _size_problem(raw)
    if problem is not None:
        raise SnapshotDecodeError(problem)
    return raw


def _size_problem(raw: bytes) -> str | None:
    """Why the scan's JSON text is more than a reader decodes (``None``: it is not)."""
    if len(raw) > MAX_SNAPSHOT_BYTES:
        return f"snapshot is larger than {MAX_SNAPSHOT_BYTES // (1024 * 1024)} MiB decompressed"
    if len(raw) <= MAX_SNAPSHOT_OBJECTS:
        return None  # a byte per brace or comma: too short to exceed either count
    objects = raw.count(b"{")
    if objects > MAX_SNAPSHOT_OBJECTS:
        return f"snapshot has {objects} JSON objects; at most {MAX_SNAPSHOT_OBJECTS} are read"
    values = raw.count(b",")
    if values > MAX_SNAPSHOT_VALUES:
        return f"snapshot has {values} JSON values; at most {MAX_SNAPSHOT_VALUES} are read"
    return None


_GPU_START = re.compile(rb'\{"index":\d+,"address":"[^"\\]*","vendor_id":')
"""Where a GPU's object starts in a scan's JSON (``vendor_id`` follows ``address`` only in
a GPU; a quote inside a string is escaped, so this never matches inside one)."""
_GPUS_OPEN = b'"gpus":['
_GPU_HEAD = b'{"index":'
_GPU_VENDOR = b'","vendor_id":'


def _gpu_starts(raw: bytes) -> list[int]:
    """Where :data:`_GPU_START` matches in ``raw``, as ``finditer`` finds them, looked for
    only before each ``vendor_id`` field (GPUs have one; a scan is mostly its VFs' type
    lists, which the regular expression would otherwise be tried at every brace of)."""
    starts: list[int] = []
    at = raw.find(_GPU_VENDOR)
    while at >= 0:
        # The address before it holds no quote: the nearest GPU head is the only candidate.
        head = raw.rfind(_GPU_HEAD, starts[-1] + 1 if starts else 0, at)
        found = _GPU_START.match(raw, head) if head >= 0 else None
        if found is not None and found.end() == at + len(_GPU_VENDOR):
            starts.append(head)
        at = raw.find(_GPU_VENDOR, at + 1)
    return starts


_NODE_OPEN = b'{"node":"'


def _named(raw: bytes) -> tuple[str, bytes | None]:
    """The node's name a scan's text starts with, and the text after it; ``None`` for the
    text when the scan names an mdev UUID, or does not start so, or the name holds an
    escape: such a scan is not the same text on other nodes but for their names."""
    if not raw.startswith(_NODE_OPEN) or _UUID in raw:
        return "", None
    end = raw.find(b'"', len(_NODE_OPEN))
    name = raw[len(_NODE_OPEN) : end]
    if end < 0 or b"\\" in name:
        return "", None
    try:
        return name.decode(), raw[end:]
    except UnicodeDecodeError:
        return "", None


_PREFIX_HEAD = 96
_SCAN_CLOSE = b"]}"
_VGPUS = b',"vgpus":'
_UUID = b'"uuid":'


@functools.cache
def _vgpu_list() -> TypeAdapter[tuple[Vgpu, ...]]:
    return TypeAdapter(tuple[Vgpu, ...])


class SnapshotDecoder:
    """Decodes reported scans; one decoder over many nodes shares what they have in common.

    Nodes of one hardware model report GPUs that are identical down to the byte
    but for their vGPUs (the same addresses, driver, VFs and creatable and offered
    type lists): each distinct GPU's JSON without its ``vgpus`` is validated once
    and the decoded (frozen) :class:`~vgpu_state.model.snapshot.Gpu` is shared by
    every scan that has it; only the ``vgpus`` list, which names each node's own
    mdev UUIDs, is decoded per node. A GPU whose ``vgpus`` name no mdev UUID (VFs
    holding types, the same on every node of a model and layout) is shared whole.
    A scan whose JSON does not split into GPUs cleanly is validated whole, as
    :func:`decode_snapshot` does, so errors read the same. The fingerprint is
    computed once (the snapshot keeps it).
    """

    SCANS = 64
    """Scans without mdev UUIDs kept (by their text but for the node's name)."""

    def __init__(self, budget: int = 4 * 1024 * 1024) -> None:
        self._gpus: dict[bytes, Gpu] = {}
        self._scans: dict[bytes, NodeSnapshot] = {}
        self._prefixes: dict[tuple[bytes, int], tuple[bytes, Gpu]] = {}
        """What precedes an mdev GPU's ``vgpus`` (its first bytes and length as the key),
        and the GPU decoded from it (a text also kept in ``_gpus``)."""
        self._held = 0
        self._budget = budget
        self.shared = 0
        """GPUs taken from the cache instead of being decoded again."""

    def decode(self, reported: ReportedSnapshot) -> NodeSnapshot:
        """The scan back from the status. Raises :class:`SnapshotDecodeError` saying what
        is wrong."""
        raw = inflate_snapshot(reported)
        name, rest = _named(raw)
        if rest is not None:
            # A scan that names no mdev UUID (VFs holding types) is, but for the node's
            # name, the text of every node of its model and layout: decoded once.
            found = self._scans.get(rest)
            if found is not None:
                self.shared += len(found.gpus)
                named = found.with_node(name)
                if named.fingerprint() != reported.fingerprint:
                    raise SnapshotDecodeError("snapshot does not match its fingerprint")
                return named
        snapshot = self._by_gpu(raw)
        if snapshot is None:
            try:
                # Validated whole, from the text (no decoded JSON held beside the models);
                # a newer agent's scan may carry fields this version does not know (both
                # paths before refuse them): they are ignored.
                snapshot = NodeSnapshot.model_validate_json(raw)
            except ValueError:
                snapshot = None
        if snapshot is None:
            try:
                data = bounded.loads(raw, "the snapshot")
                snapshot = NodeSnapshot.model_validate(known_fields(NodeSnapshot, data))
            except ValueError as e:
                first = str(e).splitlines()
                raise SnapshotDecodeError(
                    f"snapshot is not a valid scan: {'; '.join(first[:3])}"
                ) from None
        if snapshot.fingerprint() != reported.fingerprint:
            raise SnapshotDecodeError("snapshot does not match its fingerprint")
        if rest is not None and snapshot.node == name:
            if len(self._scans) >= self.SCANS:
                self._scans.clear()
            self._scans[rest] = snapshot
        return snapshot

    def _by_gpu(self, raw: bytes) -> NodeSnapshot | None:
        """The scan from its GPUs' JSON, each looked up first; ``None`` when the text is
        not a list of GPUs closing the scan (problems or an error after it, or invalid)."""
        starts = _gpu_starts(raw)
        if not starts or not raw.endswith(_SCAN_CLOSE):
            return None
        first = starts[0]
        if raw[first - len(_GPUS_OPEN) : first] != _GPUS_OPEN:
            return None
        ends = [s - 1 for s in starts[1:]] + [len(raw) - len(_SCAN_CLOSE)]
        gpus: list[Gpu] = []
        try:
            for start, end in zip(starts, ends, strict=True):
                if end < len(raw) - len(_SCAN_CLOSE) and raw[end] != 0x2C:  # ","
                    return None
                gpu = self._mdev_gpu(raw, start, end)
                gpus.append(gpu if gpu is not None else self._gpu(raw[start:end]))
            head = NodeSnapshot.model_validate_json(raw[:first] + _SCAN_CLOSE)
        except ValueError:
            return None
        if head.gpus:
            return None
        return head.with_gpus(tuple(gpus))

    def _mdev_gpu(self, raw: bytes, start: int, end: int) -> Gpu | None:
        """The GPU at ``raw[start:end]`` when its ``vgpus`` name mdev UUIDs (its own on every
        node) and what precedes them is a GPU decoded before: found by its first bytes and
        length and compared in place, without copying or hashing the text (a GPU with
        many VFs is tens of kilobytes); ``None`` when not (:meth:`_gpu` decodes it)."""
        at = raw.find(_VGPUS, start, end)
        if at < 0 or raw.find(_UUID, at, end) < 0:
            return None
        found = self._prefixes.get((raw[start : start + _PREFIX_HEAD], at - start))
        if found is None or not raw.startswith(found[0], start):
            return None
        if raw.find(_VGPUS, at + 1, end) >= 0 or raw[end - 2 : end] != b"]}":
            return None
        try:
            listed = _vgpu_list().validate_json(raw[at + len(_VGPUS) : end - 1])
        except ValueError:
            return None  # decoded as :meth:`_gpu` decodes it, with its errors
        self.shared += 1
        return found[1].with_vgpus(listed)

    def _gpu(self, text: bytes) -> Gpu:
        """A GPU from its JSON: what precedes ``vgpus`` shared, ``vgpus`` its own (and the
        whole GPU shared when its vGPUs name no mdev UUID: VFs holding the same types on
        nodes of one model are the same text). Raises ``ValueError`` when the text is not
        a GPU."""
        whole = self._gpus.get(text)
        if whole is not None:
            self.shared += 1
            return whole
        at = text.find(_VGPUS)
        if at < 0 or not text.endswith(b"]}") or text.find(_VGPUS, at + 1) >= 0:
            base, vgpus = text, None
        else:
            # vgpus is the last field written (problems, after it, is usually empty; when
            # present the list does not validate and the GPU is decoded whole).
            base, vgpus = text[:at] + b"}", text[at + len(_VGPUS) : -1]
        gpu = self._gpus.get(base)
        if gpu is None:
            gpu = Gpu.model_validate_json(base)
            self._keep(base, gpu)
        else:
            self.shared += 1
        if vgpus is None:
            return gpu
        if _UUID in vgpus and not gpu.vgpus:
            # For :meth:`_mdev_gpu`: what precedes ``vgpus``, found by its first bytes.
            prefix = base[:-1]
            self._prefixes[(prefix[:_PREFIX_HEAD], len(prefix))] = (prefix, gpu)
        try:
            listed = _vgpu_list().validate_json(vgpus)
        except ValueError:
            return Gpu.model_validate_json(text)
        if gpu.vgpus:
            raise ValueError("vgpus twice")
        gpu = gpu.with_vgpus(listed)
        if _UUID not in vgpus:
            self._keep(text, gpu)
        return gpu

    def _keep(self, text: bytes, gpu: Gpu) -> None:
        if self._held + len(text) > self._budget:
            self._gpus.clear()
            self._prefixes.clear()
            self._held = 0
        self._gpus[text] = gpu
        self._held += len(text)


_TOTAL_VGPUS_RULE = (
    "!has(self.gpus) || "
    "self.gpus.map(g, has(g.vgpus) ? size(g.vgpus) : 0).sum() <= " + str(MAX_VGPUS)
)


class VGPUNodeStateStatus(_Model):
    """The status of one node's ``VGPUNodeState``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": _TOTAL_VGPUS_RULE,
                    "message": f"a node's GPUs list at most {MAX_VGPUS} vGPUs together",
                    "fieldPath": ".gpus",
                }
            ]
        }
    )

    state: ConfigState | None = Field(
        default=None, description="The config state: pending, success or failed."
    )
    mode: AgentModeName | None = Field(
        default=None,
        description="The agent's mode in its last reconcile: enforce (applies) or plan-only "
        "(reports only); none when a person's apply wrote the status.",
    )
    selected_config: SelectedConfig | None = None
    gpus: tuple[GpuStatus, ...] = Field(default=(), max_length=MAX_GPUS)
    capacity: tuple[ResourceCapacity, ...] = Field(default=(), max_length=MAX_RESOURCES)
    vgpu_count: int = Field(default=0, ge=0, description="vGPUs on the node.")
    blocked_count: int = Field(default=0, ge=0, description="Blocked items of the last plan.")
    in_use_known: bool = Field(
        default=True, description="False when who holds which vGPU could not be read."
    )
    conditions: tuple[Condition, ...] = Field(default=(), max_length=MAX_CONDITIONS)
    last_apply: LastApply | None = None
    observed_generation: int | None = Field(default=None, ge=0)
    snapshot: ReportedSnapshot | None = Field(
        default=None,
        description="The last scan of the host, whole (what the layout and capacity describe).",
    )

    @model_validator(mode="after")
    def _total_vgpus(self) -> VGPUNodeStateStatus:
        total = sum(len(g.vgpus) for g in self.gpus)
        if total > MAX_VGPUS:
            raise ValueError(f"gpus: {total} vGPUs; a status lists at most {MAX_VGPUS}")
        return self

    def condition(self, kind: ConditionKind) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def resources(self) -> frozenset[str]:
        """The resources this node advertises (total above zero)."""
        return frozenset(c.resource_name for c in self.capacity if c.total > 0)


def layout_status(
    snapshot: NodeSnapshot,
    in_use: Mapping[str, str] | None = None,
    switches: Iterable[PendingSwitch] = (),
) -> tuple[tuple[GpuStatus, ...], tuple[ResourceCapacity, ...]]:
    """Each GPU's live layout and the capacity per resource, from a scan; ``switches``:
    the GPUs whose layout switch is pending (their withheld vGPUs count in the
    capacity's ``withheld``).

    Raises :class:`StatusBoundError` naming the bound when the host has more than a
    status may describe (:data:`MAX_GPUS`, :data:`MAX_VGPUS_PER_GPU`, :data:`MAX_VGPUS`,
    :data:`MAX_RESOURCES`, the names' lengths)."""
    _check_bounds(snapshot)
    try:
        return _layout_status(snapshot, in_use, switches)
    except ValidationError as e:
        problem = e.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise StatusBoundError(
            f"node {snapshot.node}: its status cannot describe the host: {where}: {problem['msg']}"
        ) from None


def _check_bounds(snapshot: NodeSnapshot) -> None:
    where = f"node {snapshot.node}" if snapshot.node else "this node"
    gpus = len(snapshot.gpus)
    if gpus > MAX_GPUS:
        raise StatusBoundError(
            f"{where} has {gpus} GPUs; a VGPUNodeState status describes at most {MAX_GPUS}"
        )
    for g in snapshot.gpus:
        if len(g.vgpus) > MAX_VGPUS_PER_GPU:
            raise StatusBoundError(
                f"{where}: GPU {g.address} has {len(g.vgpus)} vGPUs; a VGPUNodeState status "
                f"describes at most {MAX_VGPUS_PER_GPU} per GPU"
            )
    total = sum(len(g.vgpus) for g in snapshot.gpus)
    if total > MAX_VGPUS:
        raise StatusBoundError(
            f"{where} has {total} vGPUs; a VGPUNodeState status describes at most {MAX_VGPUS}"
        )


def _layout_status(
    snapshot: NodeSnapshot,
    in_use: Mapping[str, str] | None = None,
    switches: Iterable[PendingSwitch] = (),
) -> tuple[tuple[GpuStatus, ...], tuple[ResourceCapacity, ...]]:
    held = dict(in_use or {})
    pending = {s.gpu: s for s in switches}
    totals: dict[str, list[int]] = {}
    gpus: list[GpuStatus] = []
    for g in snapshot.gpus:
        vgpus: list[VgpuStatus] = []
        switch = pending.get(g.address)
        withheld = set(switch.withheld) if switch is not None else set()
        counted = 0
        for v in g.vgpus:
            name = v.type_sysfs_name or v.type_name or (f"nvidia-{v.type_id}" if v.type_id else "")
            try:
                resource: str | None = resource_name(name) if name else None
            except ResourceNameError:
                resource = None
            holder = held.get(v.key)
            vgpus.append(
                VgpuStatus(
                    id=v.key,
                    type=name,
                    resource_name=resource,
                    holder=holder,
                    vm=holder_vm(holder) if holder else None,
                )
            )
            if resource is not None:
                count = totals.setdefault(resource, [0, 0, 0])
                count[0] += 1
                count[1] += 0 if holder else 1
                if not holder and v.key in withheld:
                    count[2] += 1
                    counted += 1
        gpus.append(
            GpuStatus(
                address=g.address,
                model=g.model,
                layout=g.layout.value,
                vgpus=tuple(vgpus),
                switch=_switch_status(switch, counted) if switch is not None else None,
            )
        )
    if len(totals) > MAX_RESOURCES:
        raise StatusBoundError(
            f"node {snapshot.node}: its vGPUs are of {len(totals)} resources; a VGPUNodeState "
            f"status counts at most {MAX_RESOURCES}"
        )
    capacity = tuple(
        ResourceCapacity(resource_name=r, total=t, free=f, withheld=w or None)
        for r, (t, f, w) in sorted(totals.items())
    )
    return tuple(gpus), capacity


def _switch_status(switch: PendingSwitch, withheld: int) -> SwitchStatus:
    """The status of a pending switch; ``withheld``: its withheld vGPUs the scan shows free."""
    policy: Literal["protect", "ignore", "evacuate"] = (
        "evacuate" if switch.policy == "evacuate" else "ignore" if switch.policy == "ignore"
        else "protect"
    )  # fmt: skip
    return SwitchStatus(
        state=switch.state,
        policy=policy,
        departing=tuple(t[:TYPE_LENGTH] for t in switch.departing[:MAX_DEPARTING]),
        withheld=withheld or None,
        message=switch.message,
    )


def merge_conditions(
    previous: Iterable[Condition],
    current: Iterable[tuple[ConditionKind, bool | None, str, str]],
    generation: int,
    now: datetime.datetime,
) -> tuple[Condition, ...]:
    """New conditions; ``lastTransitionTime`` moves only when a condition's status changes."""
    before = {c.type: c for c in previous}
    out: list[Condition] = []
    for kind, value, reason, message in current:
        status: Literal["True", "False", "Unknown"] = (
            "Unknown" if value is None else "True" if value else "False"
        )
        old = before.get(kind)
        since = (
            old.last_transition_time if old is not None and old.status == status else rfc3339(now)
        )
        out.append(
            Condition(
                type=kind,
                status=status,
                reason=reason,
                message=message,
                observed_generation=generation,
                last_transition_time=since,
            )
        )
    return tuple(sorted(out, key=lambda c: CONDITION_KINDS.index(c.type)))


# I/O -----------------------------------------------------------------------------------
def object_path(name: str | None = None, status: bool = False) -> str:
    path = path_of(GROUP, VERSION, PLURAL, name)
    return f"{path}/status" if status and name is not None else path


def read(api: KubeApi, node: str) -> JsonObject | None:
    try:
        return api.get(object_path(node))
    except NotFoundError:
        return None


def status_of(obj: Mapping[str, Any] | None) -> VGPUNodeStateStatus | None:
    """The status of a ``VGPUNodeState`` as this version knows it; ``None`` when it cannot
    be read.

    Forward compatible: fields and condition types a newer agent writes are
    ignored, so a rolling upgrade never makes a status unreadable.
    """
    raw = (obj or {}).get("status")
    if not isinstance(raw, dict):
        return None
    try:
        return VGPUNodeStateStatus.model_validate(known_status(raw))
    except ValueError:
        return None


def known_status(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` (a status as stored) without the fields and condition types this version
    does not know: what a newer agent adds is ignored, never an error."""
    known: dict[str, Any] = known_fields(VGPUNodeStateStatus, dict(raw))
    conditions = known.get("conditions")
    if isinstance(conditions, list):
        known["conditions"] = [
            c for c in conditions if isinstance(c, dict) and c.get("type") in CONDITION_KINDS
        ]
    return known


LIST_CHUNK = 100
"""Objects per list request of :func:`list_pages`."""


def list_pages(
    api: KubeApi,
    keep: Callable[[JsonObject], T],
    chunk_size: int | None = None,
    on_version: Callable[[str], None] | None = None,
) -> Iterator[list[T]]:
    """Every ``VGPUNodeState``, page by page, each page as ``keep(obj)`` of its objects:
    each object is decoded from the response as it arrives and dropped once ``keep`` has
    seen it, so a reader holds one object and what it keeps of ``chunk_size`` of them
    (:func:`~vgpu_state.kube.liststream.stream_pages`); ``chunk_size`` defaults to
    :data:`LIST_CHUNK`; ``on_version`` is told the list's ``resourceVersion``."""
    return stream_pages(api, object_path(), chunk_size or LIST_CHUNK, keep, on_version=on_version)


def ensure(api: KubeApi, node: str, node_uid: str | None = None) -> JsonObject:
    """The node's object, created (empty spec, owned by the Node) when missing."""
    found = read(api, node)
    if found is not None:
        return found
    metadata: JsonObject = {"name": node, "labels": {"vgpu-state.io/node": node}}
    if node_uid:
        # Deleting the Node deletes its VGPUNodeState.
        metadata["ownerReferences"] = [node_owner(node, node_uid)]
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"nodeName": node},
    }
    try:
        return api.create(object_path(), body)
    except ConflictError:
        again = read(api, node)
        if again is None:
            raise
        return again


def node_owner(node: str, node_uid: str) -> JsonObject:
    """The owner reference to the Node ``node`` whose UID is ``node_uid``."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}


def _is_node_ref(ref: object) -> bool:
    return isinstance(ref, dict) and ref.get("kind") == "Node" and ref.get("apiVersion") == "v1"


def owned_by(found: Mapping[str, Any], node_uid: str) -> bool:
    """Whether ``found`` names the Node whose UID is ``node_uid`` as its owner."""
    refs = (found.get("metadata") or {}).get("ownerReferences") or []
    return any(_is_node_ref(r) and r.get("uid") == node_uid for r in refs)


def follow_node(api: KubeApi, found: JsonObject, node_uid: str) -> JsonObject | None:
    """``found`` (the node's object as read) owned by the Node whose UID is ``node_uid``
    (``None`` when it was deleted meanwhile).

    A Node deleted and registered again under the same name has a new UID; an
    owner reference to the old one is dangling, and a garbage collector deletes an
    object whose owners are all gone. The Node reference is replaced (others are
    kept) with a merge patch guarded by the ``resourceVersion`` read; on a conflict
    the object is read again.
    """
    name = str((found.get("metadata") or {}).get("name") or "")
    obj: JsonObject | None = found
    for _ in range(5):
        if obj is None:
            return None
        if owned_by(obj, node_uid):
            return obj
        meta = obj.get("metadata") or {}
        refs = meta.get("ownerReferences") or []
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "ownerReferences": [
                    *(r for r in refs if not _is_node_ref(r)),
                    node_owner(name, node_uid),
                ],
            }
        }
        try:
            return api.patch(object_path(name), patch, "merge")
        except ConflictError:
            obj = read(api, name)
    raise ContendedWriteError(f"VGPUNodeState {name}: the object kept changing; retry later")


def write_status(
    api: KubeApi, node: str, status: VGPUNodeStateStatus, node_uid: str | None = None
) -> JsonObject:
    """Replace the status, whole, through the status subresource (creating the object first).

    A PUT of ``/status`` with the object's ``resourceVersion``: fields the new
    status no longer has disappear (a merge patch would keep them), and a
    concurrent writer makes it a 409, after which it reads and writes again.
    """

    def attempt() -> JsonObject:
        obj = ensure(api, node, node_uid)
        meta = obj.get("metadata") or {}
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": node, "resourceVersion": meta.get("resourceVersion")},
            "status": status.model_copy(
                update={"observed_generation": int(meta.get("generation") or 0)}
            ).to_json(),
        }
        return api.replace(object_path(node, status=True), body)

    return retry_on_conflict(
        attempt,
        5,
        ContendedWriteError(f"VGPUNodeState {node}: the status kept changing; retry later"),
    )
