"""Config sources: a file read on every reconcile (keeping the last good document), or a
document given once."""

from __future__ import annotations

from pathlib import Path

from vgpu_state.catalog import Catalog
from vgpu_state.config.document import ConfigDocument
from vgpu_state.config.loader import load_file
from vgpu_state.model.errors import ConfigError


class FileConfigSource:
    """The config file at ``path``, read again by every :meth:`document` call.

    A read that fails (the file is missing, or invalid after an edit) does not
    replace the last good document: :meth:`document` returns that one and
    :attr:`error` holds the failure. Before any good read it raises.
    """

    def __init__(self, path: str | Path, catalog: Catalog) -> None:
        self.path = Path(path)
        self.catalog = catalog
        self._good: ConfigDocument | None = None
        self._error: ConfigError | None = None

    @property
    def error(self) -> ConfigError | None:
        """Why the newest read was not used (``None`` when it was)."""
        return self._error

    def document(self) -> ConfigDocument:
        try:
            self._good = load_file(self.path, catalog=self.catalog)
            self._error = None
        except ConfigError as e:
            self._error = e
            if self._good is None:
                raise
        return self._good


class StaticConfigSource:
    """A document that was loaded once (for example from standard input)."""

    def __init__(self, document: ConfigDocument) -> None:
        self._document = document

    @property
    def error(self) -> ConfigError | None:
        return None

    def document(self) -> ConfigDocument:
        return self._document
