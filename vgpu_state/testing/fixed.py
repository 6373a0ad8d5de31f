"""``FixedHost``: a host that always scans the same snapshot and refuses every change."""

from __future__ import annotations

import errno

from vgpu_state.model.errors import DriverError
from vgpu_state.model.snapshot import NodeSnapshot


class FixedHost:
    """A read-only :class:`~vgpu_state.ports.HostPort` for planning tests (no simulator).

    Every change raises :class:`DriverError` with ``EROFS``: a plan-only
    reconcile never calls one.
    """

    def __init__(self, snapshot: NodeSnapshot) -> None:
        self.snapshot = snapshot

    def scan(self) -> NodeSnapshot:
        return self.snapshot

    def scan_gpu(self, address: str) -> NodeSnapshot:
        return self.snapshot.only_gpu(address)

    def _refuse(self, operation: str, target: str) -> None:
        raise DriverError(operation, target, "", errno.EROFS, "FixedHost changes nothing")

    def enable_sriov(self, pf: str) -> None:
        self._refuse("sriov-enable", pf)

    def disable_sriov(self, pf: str) -> None:
        self._refuse("sriov-disable", pf)

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        self._refuse("create", parent)

    def remove_mdev(self, uuid: str) -> None:
        self._refuse("remove", uuid)

    def set_vf_type(self, vf: str, type_id: int) -> None:
        self._refuse("set-type", vf)

    def clear_vf_type(self, vf: str) -> None:
        self._refuse("clear-type", vf)
