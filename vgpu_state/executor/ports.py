"""The host port: everything the executor needs from a GPU host.

The real host (sysfs), the in-process simulator and the FUSE-served simulator
all provide it, so the same executor code runs against each of them.
"""

from __future__ import annotations

from typing import Protocol

from vgpu_state.model.snapshot import NodeSnapshot


class HostPort(Protocol):
    def scan(self) -> NodeSnapshot: ...

    def enable_sriov(self, pf: str) -> None: ...

    def disable_sriov(self, pf: str) -> None: ...

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None: ...

    def remove_mdev(self, uuid: str) -> None: ...

    def set_vf_type(self, vf: str, type_id: int) -> None: ...

    def clear_vf_type(self, vf: str) -> None: ...
