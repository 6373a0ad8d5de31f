"""The recording fakes; see :mod:`vgpu_state.testing`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vgpu_state.dra.claims import Claim
from vgpu_state.dra.prepare import DraPaths
from vgpu_state.dra.slices import DRIVER
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import NodeStatus
from vgpu_state.ports.cluster import MemoryCluster
from vgpu_state.ports.host import HostPort
from vgpu_state.wellknown import KUBELET_PLUGIN_REGISTRY_DIR


@dataclass(frozen=True)
class HostCall:
    """One driver call: the port method's name and its arguments."""

    method: str
    args: tuple[str | int, ...]


class RecordingHost:
    """A :class:`HostPort` that forwards to ``inner`` and records each call.

    :attr:`calls` lists the changes (not the scans) in order; :attr:`scans`
    counts the full node scans, :attr:`gpu_scans` lists the GPUs read one at a
    time. A call that raises is recorded too.
    """

    def __init__(self, inner: HostPort) -> None:
        self.inner = inner
        self.calls: list[HostCall] = []
        self.scans = 0
        self.gpu_scans: list[str] = []

    @property
    def changes(self) -> list[str]:
        """The calls as ``method arg …`` lines, easy to compare in a test."""
        return [" ".join([c.method, *map(str, c.args)]) for c in self.calls]

    def scan(self) -> NodeSnapshot:
        self.scans += 1
        return self.inner.scan()

    def scan_gpu(self, address: str) -> NodeSnapshot:
        self.gpu_scans.append(address)
        return self.inner.scan_gpu(address)

    def enable_sriov(self, pf: str) -> None:
        self.calls.append(HostCall("enable_sriov", (pf,)))
        self.inner.enable_sriov(pf)

    def disable_sriov(self, pf: str) -> None:
        self.calls.append(HostCall("disable_sriov", (pf,)))
        self.inner.disable_sriov(pf)

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        self.calls.append(HostCall("create_mdev", (parent, type_id, uuid)))
        self.inner.create_mdev(parent, type_id, uuid)

    def remove_mdev(self, uuid: str) -> None:
        self.calls.append(HostCall("remove_mdev", (uuid,)))
        self.inner.remove_mdev(uuid)

    def set_vf_type(self, vf: str, type_id: int) -> None:
        self.calls.append(HostCall("set_vf_type", (vf, type_id)))
        self.inner.set_vf_type(vf, type_id)

    def clear_vf_type(self, vf: str) -> None:
        self.calls.append(HostCall("clear_vf_type", (vf,)))
        self.inner.clear_vf_type(vf)

    def set_mig_mode(self, pf: str, enabled: bool) -> None:
        self.calls.append(HostCall("set_mig_mode", (pf, enabled)))
        self.inner.set_mig_mode(pf, enabled)

    def create_gpu_instance(self, pf: str, profile: str) -> int:
        self.calls.append(HostCall("create_gpu_instance", (pf, profile)))
        return self.inner.create_gpu_instance(pf, profile)

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None:
        self.calls.append(HostCall("destroy_gpu_instance", (pf, gi_id)))
        self.inner.destroy_gpu_instance(pf, gi_id)

    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None:
        self.calls.append(HostCall("set_heterogeneous_mode", (pf, enabled)))
        self.inner.set_heterogeneous_mode(pf, enabled)


class FakeCluster(MemoryCluster):
    """An in-memory :class:`~vgpu_state.ports.ClusterPort` a test can change."""

    def __init__(
        self,
        node: str = "node1",
        labels: Mapping[str, str] | None = None,
        in_use: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(node, labels, in_use)

    def set_label(self, key: str, value: str | None) -> None:
        """Set a node label (``None`` removes it)."""
        if value is None:
            self._labels.pop(key, None)
        else:
            self._labels[key] = value

    def hold(self, key: str, holder: str) -> None:
        """A pod or VM starts holding the vGPU ``key``."""
        self._in_use = self._in_use.merged({key: holder})

    def release(self, key: str) -> None:
        held = dict(self._in_use)
        held.pop(key, None)
        self._in_use = type(self._in_use)(held)

    @property
    def last_status(self) -> NodeStatus | None:
        return self.statuses[-1] if self.statuses else None


class RecordingDevicePlugin:
    """A :class:`~vgpu_state.ports.DevicePluginSink` that keeps what it is given."""

    def __init__(self) -> None:
        self.snapshots: list[NodeSnapshot] = []
        self.withheld: list[frozenset[str]] = []
        """Every set :meth:`withhold` was given, in order."""

    def refresh(self, snapshot: NodeSnapshot) -> None:
        self.snapshots.append(snapshot)

    def withhold(self, keys: frozenset[str]) -> None:
        self.withheld.append(frozenset(keys))


class MemoryClaims:
    """A :class:`~vgpu_state.dra.claims.ClaimSource` over claims held in memory."""

    def __init__(self, claims: Iterable[Claim] = ()) -> None:
        self.claims: dict[tuple[str, str], Claim] = {(c.namespace, c.name): c for c in claims}

    def put(self, claim: Claim) -> None:
        self.claims[(claim.namespace, claim.name)] = claim

    def get_claim(self, namespace: str, name: str) -> Claim | None:
        return self.claims.get((namespace, name))


def dra_paths(base: Path, sysfs_root: str | Path) -> DraPaths:
    """Every path of the DRA plugin under ``base`` (the kubelet's directories, CDI and
    ``/dev``), reading the devices of the sysfs tree at ``sysfs_root``."""
    return DraPaths(
        plugin_dir=base / "plugins" / DRIVER,
        registry_dir=base / Path(KUBELET_PLUGIN_REGISTRY_DIR).name,
        cdi_dir=base / "cdi",
        sysfs_root=Path(sysfs_root),
        dev_root=base / "dev",
    )
