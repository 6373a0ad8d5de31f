"""Prepare and unprepare claims on this node: CDI specs, device metadata, a checkpoint.

``NodePrepareResources`` for a claim writes

* one CDI spec ``<cdi dir>/<driver>_<claim uid>.json`` (kind ``<driver>/vgpu``)
  with a device ``<claim uid>-<device>`` per allocated vGPU: the VFIO device
  nodes ``/dev/vfio/vfio`` and ``/dev/vfio/<iommu group>`` (plus ``/dev/iommu``
  and ``/dev/vfio/devices/vfio<N>`` where the host has iommufd);
* per top-level request, the device-metadata file KubeVirt reads
  (``metadata.resource.k8s.io/v1alpha1`` ``DeviceMetadata``, KEP-5304) under
  ``<plugin dir>/dra-device-metadata/<claim uid>/<request>/metadata.json``
  and a CDI spec ``<driver>_metadata_<claim uid>_<request>.json`` (kind
  ``<driver>/metadata``) that bind-mounts it read-only where the pod looks:
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/``
  or, for a claim made from a template, ``…/resourceclaimtemplates/<pod claim name>/<request>/``;

and records the claim in a checkpoint file, so that unprepare (which gets only
namespace, name and UID, and may come after the claim is gone) removes exactly
what prepare wrote. Both calls are idempotent, as the kubelet retries them.
CDI device names carry the claim UID, so a runtime's cached spec is never reused.

A request that uses ``firstAvailable`` is allocated as ``<request>/<subrequest>``.
The kubelet matches a container's ``resources.claims[].request`` against the
*top-level* name, so the reply's ``request_names``, the metadata file's
directory, its CDI device and its container path all use ``<request>``; only
``requests[].name`` inside the metadata document keeps the full name (as
``k8s.io/dynamic-resource-allocation`` does). Every file is keyed by the claim
UID, which is checked first: a UID that is not one (``*``, ``../x``) is refused,
and unpreparing one claim never touches another's files, even one with the same
namespace and name.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpu_state.dra.claims import Claim, ClaimSource
from vgpu_state.dra.slices import DRIVER, DraDevice
from vgpu_state.model import bounded
from vgpu_state.model.errors import HostError
from vgpu_state.wellknown import CDI_DIR, KUBELET_PLUGIN_REGISTRY_DIR

log = logging.getLogger(__name__)

CDI_VERSION = "0.5.0"
METADATA_API_VERSION = "metadata.resource.k8s.io/v1alpha1"
CONTAINER_METADATA_ROOT = "/var/run/kubernetes.io/dra-device-attributes"
CHECKPOINT_VERSION = 1

_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""What a claim UID may look like here: the API server's UUIDs, or any name that is a
plain file-name part (no ``/``, no glob or shell characters, no leading dot)."""


def uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot name a claim's files, or ``None``."""
    if _UID.match(uid):
        return None
    return f"claim UID {uid!r} is not a Kubernetes UID (letters, digits, '-', '_', '.')"


def base_request(request: str) -> str:
    """The top-level request of an allocation result: ``gpu`` for ``gpu/l40s`` (firstAvailable)."""
    return request.split("/", 1)[0]


def kubevirt_problem(claim: str, requests: Sequence[str]) -> str | None:
    """Why KubeVirt (1.9 and older) cannot build a VM's GPU from a claim allocated
    ``requests`` (one entry per device, ``<request>`` or ``<request>/<subrequest>``),
    or ``None``: it looks a GPU's device up under ``<request>`` and takes one device.
    The claim is prepared either way (a pod other than a VM's may use it)."""
    sub = sorted({r for r in requests if "/" in r})
    if sub:
        return (
            f"{claim}: request {sub[0]} was allocated through firstAvailable; KubeVirt 1.9 "
            f"and older look its device up as {base_request(sub[0])!r} and cannot build a "
            'VM\'s GPU from it (docs/dra.md, "Claims KubeVirt can use")'
        )
    counts: dict[str, int] = {}
    for r in requests:
        counts[r] = counts.get(r, 0) + 1
    many = sorted(r for r, n in counts.items() if n > 1)
    if many:
        return (
            f"{claim}: request {many[0]} was allocated {counts[many[0]]} devices; a KubeVirt "
            'GPU takes one device per request (docs/dra.md, "Claims KubeVirt can use")'
        )
    return None


@dataclass(frozen=True)
class DraPaths:
    """Where the plugin reads and writes; every path is configurable (tests use temp dirs)."""

    plugin_dir: Path
    """``/var/lib/kubelet/plugins/<driver>``: ``dra.sock``, checkpoint, metadata files."""
    registry_dir: Path = Path(KUBELET_PLUGIN_REGISTRY_DIR)
    cdi_dir: Path = Path(CDI_DIR)
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")

    @property
    def socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def metadata_dir(self) -> Path:
        return self.plugin_dir / "dra-device-metadata"


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    """The allocation result's request: ``<request>`` or ``<request>/<subrequest>``."""
    pool: str
    device: str
    cdi_ids: tuple[str, ...]

    @property
    def top_request(self) -> str:
        """The top-level request name, the one the kubelet matches containers against."""
        return base_request(self.request)


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass
class _Entry:
    namespace: str
    name: str
    devices: list[PreparedDevice] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


class PrepareError(Exception):
    """A claim cannot be prepared; the message goes back to the kubelet."""


class CheckpointError(HostError):
    """The checkpoint file cannot be read; the plugin does not start (the message says why)."""


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _entry_from_json(uid: str, item: Any) -> _Entry:
    problem = uid_problem(uid)
    if problem is not None:
        raise ValueError(problem)
    if not isinstance(item, dict):
        raise TypeError(f"entry is a {type(item).__name__}, not a mapping")

    def text(obj: Any, key: str) -> str:
        value = obj[key]
        if not isinstance(value, str):
            raise TypeError(f"{key!r} is not a string: {value!r}")
        return value

    devices = item["devices"]
    files = item["files"]
    if not isinstance(devices, list) or not isinstance(files, list):
        raise TypeError("'devices' and 'files' must be lists")
    return _Entry(
        namespace=text(item, "namespace"),
        name=text(item, "name"),
        devices=[
            PreparedDevice(
                text(d, "request"),
                text(d, "pool"),
                text(d, "device"),
                tuple(str(i) for i in d["cdi_ids"]),
            )
            for d in devices
        ],
        files=[str(f) for f in files],
    )


class Preparer:
    """The driver side of ``NodePrepareResources`` / ``NodeUnprepareResources``.

    ``inventory`` returns the devices this node publishes for DRA now (the
    same values the ResourceSlices are built from); a claim allocated to
    anything else is refused.
    """

    def __init__(
        self,
        *,
        node: str,
        claims: ClaimSource,
        inventory: Callable[[], Mapping[str, DraDevice]],
        paths: DraPaths,
        driver: str = DRIVER,
    ) -> None:
        self.node = node
        self.claims = claims
        self.inventory = inventory
        self.paths = paths
        self.driver = driver
        self._lock = threading.Lock()
        self._entries = self._load()

    # checkpoint -----------------------------------------------------------
    def _load(self) -> dict[str, _Entry]:
        path = self.paths.checkpoint
        aside = (
            "move it aside to start without it (unprepare still finds each claim's files "
            "by its UID)"
        )
        try:
            raw = bounded.loads(path.read_text(encoding="utf-8"), str(path))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path}: unreadable DRA checkpoint ({e}); {aside}") from e
        if not isinstance(raw, dict) or raw.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(
                f"{path}: not a version {CHECKPOINT_VERSION} DRA checkpoint; {aside}"
            )
        claims = raw.get("claims") or {}
        if not isinstance(claims, dict):
            raise CheckpointError(f"{path}: 'claims' is not a mapping; {aside}")
        entries: dict[str, _Entry] = {}
        for uid, item in claims.items():
            try:
                entries[uid] = _entry_from_json(uid, item)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
                raise CheckpointError(
                    f"{path}: claim {uid!r}: {what}; not a valid version {CHECKPOINT_VERSION} "
                    f"DRA checkpoint; {aside}"
                ) from e
        return entries

    def _save(self) -> None:
        _write_json(
            self.paths.checkpoint,
            {
                "version": CHECKPOINT_VERSION,
                "claims": {
                    uid: {
                        "namespace": e.namespace,
                        "name": e.name,
                        "devices": [
                            {
                                "request": d.request,
                                "pool": d.pool,
                                "device": d.device,
                                "cdi_ids": list(d.cdi_ids),
                            }
                            for d in e.devices
                        ],
                        "files": e.files,
                    }
                    for uid, e in sorted(self._entries.items())
                },
            },
        )

    def prepared(self) -> dict[str, tuple[str, ...]]:
        """Claim UID -> device names, for every claim prepared on this node."""
        with self._lock:
            return {u: tuple(d.device for d in e.devices) for u, e in self._entries.items()}

    # prepare --------------------------------------------------------------
    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        with self._lock:
            for ref in refs:
                problem = uid_problem(ref.uid)
                if problem is not None:
                    out[ref.uid] = PrepareResult(error=problem)
                    continue
                entry = self._entries.get(ref.uid)
                if entry is not None:
                    out[ref.uid] = PrepareResult(devices=tuple(entry.devices))
                    continue
                try:
                    out[ref.uid] = PrepareResult(devices=self._prepare_one(ref))
                except PrepareError as e:
                    out[ref.uid] = PrepareResult(error=str(e))
        return out

    def _claim(self, ref: ClaimRef) -> Claim:
        claim = self.claims.get_claim(ref.namespace, ref.name)
        what = f"ResourceClaim {ref.namespace}/{ref.name}"
        if claim is None:
            raise PrepareError(f"{what} not found")
        if claim.uid != ref.uid:
            raise PrepareError(f"{what} has UID {claim.uid}, the kubelet asked for {ref.uid}")
        if not claim.allocated:
            raise PrepareError(f"{what} is not allocated")
        return claim

    def _prepare_one(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        claim = self._claim(ref)
        results = claim.ours(self.driver, self.node)
        if not results:
            raise PrepareError(
                f"ResourceClaim {ref.namespace}/{ref.name} has no device of driver "
                f"{self.driver} in pool {self.node}"
            )
        inventory = self.inventory()
        held = {d.device: uid for uid, e in self._entries.items() for d in e.devices}
        devices: list[tuple[str, DraDevice, _Vfio]] = []
        for r in results:
            dev = inventory.get(r.device)
            if dev is None:
                raise PrepareError(
                    f"device {r.device} is not offered for DRA on node {self.node} "
                    "(it does not exist, or its vGPU is published through the device plugin)"
                )
            if r.device in held:
                raise PrepareError(
                    f"device {r.device} is already prepared for claim UID {held[r.device]}"
                )
            devices.append((r.request, dev, self._vfio(dev)))
        problem = kubevirt_problem(
            f"ResourceClaim {ref.namespace}/{ref.name}", [r.request for r in results]
        )
        if problem is not None:
            log.warning("%s", problem)

        files: list[Path] = []
        cdi_kind = f"{self.driver}/vgpu"
        spec_devices = []
        prepared: list[PreparedDevice] = []
        for request, dev, vfio in devices:
            cdi_name = f"{ref.uid}-{dev.name}"
            spec_devices.append({"name": cdi_name, "containerEdits": vfio.edits()})
            prepared.append(
                PreparedDevice(request, self.node, dev.name, (f"{cdi_kind}={cdi_name}",))
            )
        spec_path = self.paths.cdi_dir / f"{self.driver}_{ref.uid}.json"
        _write_json(
            spec_path,
            {
                "cdiVersion": CDI_VERSION,
                "kind": cdi_kind,
                "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/vfio"}]},
                "devices": spec_devices,
            },
        )
        files.append(spec_path)
        files += self._metadata(claim, devices, prepared)
        self._entries[ref.uid] = _Entry(
            namespace=ref.namespace,
            name=ref.name,
            devices=prepared,
            files=[str(f) for f in files],
        )
        self._save()
        return tuple(prepared)

    def _metadata(
        self,
        claim: Claim,
        devices: list[tuple[str, DraDevice, _Vfio]],
        prepared: list[PreparedDevice],
    ) -> list[Path]:
        """The KEP-5304 metadata file per top-level request and the CDI spec that mounts it."""
        files: list[Path] = []
        requests: dict[str, list[DraDevice]] = {}
        for request, dev, _ in devices:
            requests.setdefault(request, []).append(dev)
        claim_dir = self.claim_metadata_dir(claim.uid)
        for request, devs in requests.items():
            top = base_request(request)
            host = claim_dir / _safe(top) / "metadata.json"
            doc = {
                "apiVersion": METADATA_API_VERSION,
                "kind": "DeviceMetadata",
                "metadata": {
                    "name": claim.name,
                    "namespace": claim.namespace,
                    "uid": claim.uid,
                    "generation": _next_generation(host, claim.uid),
                },
                "requests": [
                    {
                        "name": request,
                        "devices": [
                            {
                                "driver": self.driver,
                                "pool": self.node,
                                "name": d.name,
                                "attributes": d.api_attributes(),
                            }
                            for d in devs
                        ],
                    }
                ],
            }
            if claim.pod_claim_name:
                doc["podClaimName"] = claim.pod_claim_name
                where = f"resourceclaimtemplates/{claim.pod_claim_name}"
            else:
                where = f"resourceclaims/{claim.name}"
            _write_json(host, doc)
            container = f"{CONTAINER_METADATA_ROOT}/{where}/{top}/{self.driver}-metadata.json"
            name = f"{claim.uid}_{_safe(top)}"
            spec = self.paths.cdi_dir / f"{self.driver}_metadata_{name}.json"
            _write_json(
                spec,
                {
                    "cdiVersion": CDI_VERSION,
                    "kind": f"{self.driver}/metadata",
                    "devices": [
                        {
                            "name": name,
                            "containerEdits": {
                                "mounts": [
                                    {
                                        "hostPath": str(host),
                                        "containerPath": container,
                                        "options": ["ro", "bind"],
                                    }
                                ]
                            },
                        }
                    ],
                },
            )
            files.append(spec)
            first = next(i for i, p in enumerate(prepared) if p.request == request)
            p = prepared[first]
            prepared[first] = PreparedDevice(
                p.request, p.pool, p.device, (*p.cdi_ids, f"{self.driver}/metadata={name}")
            )
        return files

    def claim_metadata_dir(self, uid: str) -> Path:
        """Where a claim's metadata files live on the host: one directory per claim UID."""
        return self.paths.metadata_dir / uid

    def _vfio(self, dev: DraDevice) -> _Vfio:
        sysfs = self.paths.sysfs_root
        if dev.kind == "mdev":
            node = sysfs / "bus" / "mdev" / "devices" / dev.key
        else:
            node = sysfs / "bus" / "pci" / "devices" / dev.key
        try:
            group = os.path.basename(os.readlink(node / "iommu_group"))
        except OSError as e:
            raise PrepareError(
                f"device {dev.name}: cannot read its IOMMU group at {node / 'iommu_group'} "
                f"({e.strerror or e})"
            ) from e
        if not group.isdigit():
            raise PrepareError(f"device {dev.name}: IOMMU group {group!r} is not a number")
        cdev = None
        if (self.paths.dev_root / "iommu").exists():
            try:
                found = sorted(
                    n
                    for n in os.listdir(node / "vfio-dev")
                    if n.startswith("vfio") and n[4:].isdigit()
                )
            except OSError:
                found = []
            cdev = found[0] if found else None
        return _Vfio(group=int(group), cdev=cdev)

    # unprepare ------------------------------------------------------------
    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Remove what prepare wrote; claim UID -> error text (empty on success)."""
        out: dict[str, str] = {}
        with self._lock:
            for ref in refs:
                problem = uid_problem(ref.uid)
                if problem is not None:
                    out[ref.uid] = f"unprepare {ref.namespace}/{ref.name}: {problem}"
                    continue
                try:
                    self._unprepare_one(ref)
                    out[ref.uid] = ""
                except OSError as e:
                    out[ref.uid] = f"unprepare {ref.namespace}/{ref.name}: {e}"
        return out

    def _unprepare_one(self, ref: ClaimRef) -> None:
        """Remove the files of the claim with this UID (validated), and nothing else.

        A claim not in the checkpoint (prepared before a lost checkpoint, or
        never) still loses every file named after its UID; the names are
        compared as strings, never used as patterns.
        """
        entry = self._entries.get(ref.uid)
        files = {Path(f) for f in entry.files} if entry else set()
        cdi = self.paths.cdi_dir
        files.add(cdi / f"{self.driver}_{ref.uid}.json")
        prefix = f"{self.driver}_metadata_{ref.uid}_"
        if cdi.is_dir():
            files.update(
                cdi / n for n in os.listdir(cdi) if n.startswith(prefix) and n.endswith(".json")
            )
        for f in files:
            f.unlink(missing_ok=True)
        _remove_tree(self.claim_metadata_dir(ref.uid))
        if entry is not None:
            # Written by earlier versions, which kept metadata under <namespace>_<name>.
            legacy = self.paths.metadata_dir / _safe(f"{entry.namespace}_{entry.name}")
            _remove_legacy(legacy, ref.uid)
            del self._entries[ref.uid]
            self._save()


def _next_generation(path: Path, uid: str) -> int:
    """1 for a new metadata file; one more than the file's own when it is rewritten."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        meta = old["metadata"]
        if meta["uid"] == uid:
            return int(meta["generation"]) + 1
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return 1


def _remove_legacy(path: Path, uid: str) -> None:
    """Remove an old ``<namespace>_<name>`` metadata directory if its files are this claim's."""
    if not path.is_dir():
        return
    for meta in path.glob("*/metadata.json"):
        try:
            if json.loads(meta.read_text(encoding="utf-8"))["metadata"]["uid"] != uid:
                return
        except (OSError, ValueError, KeyError, TypeError):
            return
    _remove_tree(path)


def _remove_tree(path: Path) -> None:
    if not path.is_dir():
        return
    for root, dirs, names in os.walk(path, topdown=False):
        for n in names:
            os.unlink(os.path.join(root, n))
        for d in dirs:
            os.rmdir(os.path.join(root, d))
    os.rmdir(path)


@dataclass(frozen=True)
class _Vfio:
    group: int
    cdev: str | None = None

    def edits(self) -> dict[str, Any]:
        nodes: list[dict[str, str]] = [{"path": f"/dev/vfio/{self.group}"}]
        if self.cdev:
            nodes += [{"path": "/dev/iommu"}, {"path": f"/dev/vfio/devices/{self.cdev}"}]
        return {"deviceNodes": nodes}
