"""``ConfigSource``: where the config document comes from, keeping the last good one."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vgpu_state.config.document import ConfigDocument
from vgpu_state.model.errors import ConfigError


@runtime_checkable
class ConfigSource(Protocol):
    """The config document of the node.

    :meth:`document` reads the source now. When the newest read is invalid it
    returns the last good document and :attr:`error` says why the new one was
    not used; with no good document yet it raises the :class:`ConfigError`.
    Real: :class:`vgpu_state.config.FileConfigSource` (a file, or a mounted
    ConfigMap); fixed: :class:`vgpu_state.config.StaticConfigSource`.
    """

    def document(self) -> ConfigDocument: ...

    @property
    def error(self) -> ConfigError | None: ...
