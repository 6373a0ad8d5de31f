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
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

from vgpu_state.kube.api import ConflictError, JsonObject, KubeApi, path_of, retry_on_conflict
from vgpu_state.kube.errors import ContendedWriteError, NotFoundError
from vgpu_state.model import bounded
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.lenient import known_fields
from vgpu_state.model.resources import ResourceNameError, resource_name
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu
from vgpu_state.model.status import ConfigState
from vgpu_state.model.timestamps import rfc3339

GROUP = "vgpu-state.io"
VERSION = "v1alpha1"
KIND = "VGPUNodeState"
PLURAL = "vgpunodestates"
SINGULAR = "vgpunodestate"
SHORT_NAMES = ("vgpuns",)
API_VERSION = f"{GROUP}/{VERSION}"

ConditionKind = Literal["Synced", "Ready", "Blocked", "Degraded", "KubeletAllocatable"]
CONDITION_KINDS: tuple[ConditionKind, ...] = (
    "Synced",
    "Ready",
    "Blocked",
    "Degraded",
    "KubeletAllocatable",
)


class _Model(Frozen):
    """A frozen model whose JSON keys are camelCase, as Kubernetes writes them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class SelectedConfig(_Model):
    """Which config the node runs and why."""

    name: str | None = Field(default=None, description="The selected config; absent when none.")
    source: Literal["label", "node-selector", "default", "explicit", "none"] = Field(
        description="What selected it: the node label, a node-selectors rule, the default, "
        "an explicit choice, or nothing."
    )
    reason: str = Field(description="The selection in words, e.g. the label and its value.")
    document_hash: str | None = Field(
        default=None, description="sha256 of the config document the selection came from."
    )


class VgpuStatus(_Model):
    id: str = Field(description="The mdev UUID, or the VF address for vendor-VFIO vGPUs.")
    type: str = Field(description="The vGPU type as the driver names it.")
    resource_name: str | None = Field(
        default=None, description="The extended resource the device plugin advertises it as."
    )
    holder: str | None = Field(default=None, description="The pod or VM holding it, if any.")


class GpuStatus(_Model):
    address: str = Field(description="The GPU's PCI address.")
    model: str | None = Field(default=None, description="The GPU model, when known.")
    layout: str = Field(description="mdev, vendor-vfio, sriov-disabled or unavailable.")
    vgpus: tuple[VgpuStatus, ...] = Field(default=(), description="The GPU's live vGPUs.")


class ResourceCapacity(_Model):
    resource_name: str
    total: int = Field(ge=0, description="vGPUs of this resource on the node.")
    free: int = Field(ge=0, description="Of those, the ones no pod or VM holds.")


class Condition(_Model):
    type: ConditionKind
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="A stable CamelCase code.")
    message: str = ""
    observed_generation: int = Field(default=0, ge=0)
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")


class LastApply(_Model):
    plan_id: str = Field(description="The plan's id (its fingerprint).")
    start: str = Field(description="When the apply started (RFC 3339).")
    end: str | None = Field(default=None, description="When it ended; absent while running.")
    result: Literal["running", "success", "failed", "blocked", "no-changes"]
    message: str = ""


SNAPSHOT_ENCODING: Literal["gzip+base64"] = "gzip+base64"
MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024
"""A reported scan larger than this, decompressed, is refused (8 GPUs × 32 VFs: ~80 KiB)."""


class ReportedSnapshot(_Model):
    """The scan a status describes, whole: what ``vgpu-state fleet plan`` plans against.

    ``gpus`` shows the layout for people; this is the planner's input (every
    VF, every type the driver offers or can create), compressed so that a
    status stays small and a list of a thousand nodes stays fast.
    """

    encoding: Literal["gzip+base64"] = Field(
        default=SNAPSHOT_ENCODING, description="How data is encoded: gzip, then base64."
    )
    fingerprint: str = Field(description="sha256 of the scan's vGPU state, as plans record it.")
    scanned_at: str = Field(description="When the node's host was scanned (RFC 3339).")
    data: str = Field(description="The scan as JSON, gzip-compressed, base64-encoded.")


class SnapshotDecodeError(ValueError):
    """A reported scan cannot be read back (bad encoding, truncated, too large, invalid)."""


def encode_snapshot(snapshot: NodeSnapshot, scanned_at: datetime.datetime) -> ReportedSnapshot:
    """``snapshot`` for the status; equal scans give equal text (no gzip timestamp)."""
    raw = snapshot.model_dump_json(exclude_defaults=True).encode()
    packed = gzip.compress(raw, compresslevel=6, mtime=0)
    return ReportedSnapshot(
        fingerprint=snapshot.fingerprint(),
        scanned_at=rfc3339(scanned_at),
        data=base64.b64encode(packed).decode("ascii"),
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
    return raw


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

    def __init__(self, budget: int = 4 * 1024 * 1024) -> None:
        self._gpus: dict[bytes, Gpu] = {}
        self._held = 0
        self._budget = budget
        self.shared = 0
        """GPUs taken from the cache instead of being decoded again."""

    def decode(self, reported: ReportedSnapshot) -> NodeSnapshot:
        """The scan back from the status. Raises :class:`SnapshotDecodeError` saying what
        is wrong."""
        raw = inflate_snapshot(reported)
        snapshot = self._by_gpu(raw)
        if snapshot is None:
            try:
                # Validated whole; a newer agent's scan may carry fields this version does
                # not know (the shared per-GPU path refuses them): they are ignored.
                data = bounded.loads(raw, "the snapshot")
                snapshot = NodeSnapshot.model_validate(known_fields(NodeSnapshot, data))
            except ValueError as e:
                first = str(e).splitlines()
                raise SnapshotDecodeError(
                    f"snapshot is not a valid scan: {'; '.join(first[:3])}"
                ) from None
        if snapshot.fingerprint() != reported.fingerprint:
            raise SnapshotDecodeError("snapshot does not match its fingerprint")
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
                gpus.append(self._gpu(raw[start:end]))
            head = NodeSnapshot.model_validate_json(raw[:first] + _SCAN_CLOSE)
        except ValueError:
            return None
        if head.gpus:
            return None
        return head.with_gpus(tuple(gpus))

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
            self._held = 0
        self._gpus[text] = gpu
        self._held += len(text)


class VGPUNodeStateStatus(_Model):
    """The status of one node's ``VGPUNodeState``."""

    state: ConfigState | None = Field(
        default=None, description="The config state: pending, success or failed."
    )
    selected_config: SelectedConfig | None = None
    gpus: tuple[GpuStatus, ...] = ()
    capacity: tuple[ResourceCapacity, ...] = ()
    vgpu_count: int = Field(default=0, ge=0, description="vGPUs on the node.")
    blocked_count: int = Field(default=0, ge=0, description="Blocked items of the last plan.")
    in_use_known: bool = Field(
        default=True, description="False when who holds which vGPU could not be read."
    )
    conditions: tuple[Condition, ...] = ()
    last_apply: LastApply | None = None
    observed_generation: int | None = Field(default=None, ge=0)
    snapshot: ReportedSnapshot | None = Field(
        default=None,
        description="The last scan of the host, whole (what the layout and capacity describe).",
    )

    def condition(self, kind: ConditionKind) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def resources(self) -> frozenset[str]:
        """The resources this node advertises (total above zero)."""
        return frozenset(c.resource_name for c in self.capacity if c.total > 0)


def layout_status(
    snapshot: NodeSnapshot, in_use: Mapping[str, str] | None = None
) -> tuple[tuple[GpuStatus, ...], tuple[ResourceCapacity, ...]]:
    """Each GPU's live layout and the capacity per resource, from a scan."""
    held = dict(in_use or {})
    totals: dict[str, list[int]] = {}
    gpus: list[GpuStatus] = []
    for g in snapshot.gpus:
        vgpus: list[VgpuStatus] = []
        for v in g.vgpus:
            name = v.type_sysfs_name or v.type_name or (f"nvidia-{v.type_id}" if v.type_id else "")
            try:
                resource: str | None = resource_name(name) if name else None
            except ResourceNameError:
                resource = None
            holder = held.get(v.key)
            vgpus.append(VgpuStatus(id=v.key, type=name, resource_name=resource, holder=holder))
            if resource is not None:
                count = totals.setdefault(resource, [0, 0])
                count[0] += 1
                count[1] += 0 if holder else 1
        gpus.append(
            GpuStatus(address=g.address, model=g.model, layout=g.layout.value, vgpus=tuple(vgpus))
        )
    capacity = tuple(
        ResourceCapacity(resource_name=r, total=t, free=f) for r, (t, f) in sorted(totals.items())
    )
    return tuple(gpus), capacity


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


def list_all(api: KubeApi) -> list[JsonObject]:
    return api.list(object_path())


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
