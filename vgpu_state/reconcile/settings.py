"""``Settings``: everything a reconcile is configured with, passed down explicitly."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vgpu_state.catalog import Catalog
from vgpu_state.config.selection import DEFAULT_LABEL_KEY


@dataclass(frozen=True)
class Settings:
    """How to reconcile, decided once by the shell (CLI flags, agent configuration).

    Nothing below the shell reads the environment or the command line; what it
    needs is here.
    """

    catalog: Catalog
    """The GPU models and vGPU types that advise validation and planning."""
    journal_path: Path | None = None
    """The apply journal; ``None`` keeps no journal."""
    driver_types_path: Path | None = None
    """The vGPU types the node's driver listed (``driver-types.json`` beside the
    journal), which name the vGPUs of a full GPU whose types the catalog lacks;
    ``None`` remembers them only while the host port lives."""
    lock_path: Path | None = None
    """The host lock taken around an apply; ``None`` takes no lock."""
    lock_timeout: float = 30.0
    """Seconds to wait for the host lock."""
    label_key: str = DEFAULT_LABEL_KEY
    """The node label that names a config."""
    default_config: str | None = None
    """The config of a node nothing else selects when the file has no ``default:``
    (``--default-config``, ``$DEFAULT_VGPU_CONFIG``)."""
    strict: bool = False
    """An entry that selects no GPU of the node is an error, not a skipped entry
    (``--strict``)."""
    sriov_manage: tuple[str, ...] | None = None
    """The sriov-manage command line a real host runs to turn SR-IOV on and off.
    ``None``: ``/usr/lib/nvidia/sriov-manage`` when installed, else write
    ``sriov_numvfs``; ``()``: always write ``sriov_numvfs``. The shell builds the
    host port from this value (``SysfsHost(..., settings.sriov_manage)``)."""
    nvidia_smi: tuple[str, ...] | None = None
    """The nvidia-smi command line a real host runs to read and change MIG and
    mixed-size mode. ``None``: ``/usr/bin/nvidia-smi`` when installed; ``()``: none
    (the modes are not read, and a layout that changes them cannot be applied)."""
    clock: Callable[[], float] = time.time
    """Wall-clock time (Unix seconds) for journal records."""
    command: str = ""
    """What is running, recorded in the host lock for whoever waits on it."""
