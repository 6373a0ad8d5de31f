"""What a node's driver said about its vGPU types: a table of (GPU, type id) → name.

On the vendor-specific VFIO layout the driver lists a GPU's types (id and name,
in each free VF's ``creatable_vgpu_types``) only while something is creatable;
once the GPU is full no VF lists any type. A vGPU whose type id neither the
catalog nor the current listing names is then named from this table, which
every scan that sees a listing extends. Pure values: the memory a host keeps
and the table's file are :mod:`vgpu_state.statefiles.drivertypes`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_state.model import bounded
from vgpu_state.model.snapshot import Gpu, NodeSnapshot

FORMAT_VERSION = 1
MAX_GPU_MODELS = 256
"""At most this many GPU models (PCI ids) in one table."""
MAX_TYPES_PER_GPU = 1024
"""At most this many type ids per GPU model."""

_GPU_KEY = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{4}$")
_TYPE_ID = re.compile(r"^[1-9][0-9]{0,9}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
_SYSFS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+-]{0,127}$")


class DriverTypesError(ValueError):
    """The text is not a driver-types table; the message says where."""


@dataclass(frozen=True)
class RememberedType:
    """A type as the driver listed it: the short name and the driver's own name."""

    name: str
    sysfs_name: str | None = None


def gpu_key(gpu: Gpu) -> str:
    """The GPU model a remembered type belongs to: ``vendor:device:subsystem device`` (hex)."""
    return f"{gpu.vendor_id:04x}:{gpu.device_id:04x}:{gpu.subsystem_device_id:04x}"


def _listed(gpu: Gpu) -> dict[int, RememberedType]:
    """The types the GPU's driver lists in this scan, by id, with the driver's own names."""
    found: dict[int, RememberedType] = {}
    for t in (*gpu.pf_creatable, *(t for vf in gpu.vfs for t in vf.creatable)):
        # Only what the driver itself named (a listing, an mdev ``name`` file); never a
        # name the scan took from the catalog.
        if t.sysfs_name is None or t.type_id <= 0:
            continue
        if not (_NAME.match(t.name) and _SYSFS_NAME.match(t.sysfs_name)):
            continue
        found[t.type_id] = RememberedType(t.name, t.sysfs_name)
    return found


@dataclass(frozen=True)
class DriverTypes:
    """Remembered types by GPU model (:func:`gpu_key`) and type id."""

    gpus: Mapping[str, Mapping[int, RememberedType]] = field(default_factory=dict)

    def lookup(self, gpu: Gpu, type_id: int) -> RememberedType | None:
        return self.gpus.get(gpu_key(gpu), {}).get(type_id)

    def learn(self, snapshot: NodeSnapshot) -> DriverTypes:
        """This table with what the driver lists in ``snapshot``; the listing wins a conflict."""
        merged: dict[str, dict[int, RememberedType]] | None = None
        for gpu in snapshot.gpus:
            listed = _listed(gpu)
            if not listed:
                continue
            key = gpu_key(gpu)
            known = self.gpus.get(key, {})
            if all(known.get(i) == t for i, t in listed.items()):
                continue
            if merged is None:
                merged = {k: dict(v) for k, v in self.gpus.items()}
            if key not in merged and len(merged) >= MAX_GPU_MODELS:
                continue
            row = merged.setdefault(key, {})
            for i, t in sorted(listed.items()):
                if i in row or len(row) < MAX_TYPES_PER_GPU:
                    row[i] = t
        return self if merged is None else DriverTypes(merged)

    def name_vgpus(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """``snapshot`` with every vGPU the scan could not name named from this table.

        Only a vGPU without a name is touched: what the catalog or the live
        listing said (the scan's name) always stands.
        """
        gpus = list(snapshot.gpus)
        changed = False
        for n, gpu in enumerate(gpus):
            vgpus = list(gpu.vgpus)
            touched = False
            for m, v in enumerate(vgpus):
                if v.type_id is None or v.type_name is not None:
                    continue
                found = self.lookup(gpu, v.type_id)
                if found is None:
                    continue
                vgpus[m] = v.model_copy(
                    update={
                        "type_name": found.name,
                        "type_sysfs_name": v.type_sysfs_name or found.sysfs_name,
                    }
                )
                touched = True
            if touched:
                gpus[n] = gpu.model_copy(update={"vgpus": tuple(vgpus)})
                changed = True
        return snapshot.model_copy(update={"gpus": tuple(gpus)}) if changed else snapshot

    # the file's text ----------------------------------------------------------------
    def dumps(self) -> str:
        data = {
            "format_version": FORMAT_VERSION,
            "gpus": {
                key: {
                    str(i): {"name": t.name, "sysfs_name": t.sysfs_name}
                    for i, t in sorted(row.items())
                }
                for key, row in sorted(self.gpus.items())
            },
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str) -> DriverTypes:
        """The table of ``text``; raises :class:`DriverTypesError` on anything unexpected."""
        try:
            data = bounded.loads(text, "the driver-types table")
        except (ValueError, RecursionError) as e:
            raise DriverTypesError(f"not valid JSON ({e})") from None
        if not isinstance(data, dict) or set(data) != {"format_version", "gpus"}:
            raise DriverTypesError(
                "not a driver-types table (an object with format_version and gpus)"
            )
        version = data["format_version"]
        if type(version) is not int or version != FORMAT_VERSION:
            raise DriverTypesError(f"format_version {version!r} is not {FORMAT_VERSION}")
        gpus = _object(data["gpus"], "gpus")
        if len(gpus) > MAX_GPU_MODELS:
            raise DriverTypesError(f"gpus: more than {MAX_GPU_MODELS} GPU models")
        table: dict[str, dict[int, RememberedType]] = {}
        for key, row in gpus.items():
            if not _GPU_KEY.match(key):
                raise DriverTypesError(f"gpus: {key!r} is not vendor:device:subsystem (hex)")
            types = _object(row, f"gpus.{key}")
            if len(types) > MAX_TYPES_PER_GPU:
                raise DriverTypesError(f"gpus.{key}: more than {MAX_TYPES_PER_GPU} types")
            table[key] = {}
            for type_id, entry in types.items():
                where = f"gpus.{key}.{type_id}"
                if not _TYPE_ID.match(type_id):
                    raise DriverTypesError(f"gpus.{key}: {type_id!r} is not a type id")
                fields = _object(entry, where)
                if set(fields) != {"name", "sysfs_name"}:
                    raise DriverTypesError(f"{where}: needs exactly name and sysfs_name")
                name, sysfs_name = fields["name"], fields["sysfs_name"]
                if not isinstance(name, str) or not _NAME.match(name):
                    raise DriverTypesError(f"{where}.name: {name!r} is not a vGPU type name")
                if sysfs_name is not None and (
                    not isinstance(sysfs_name, str) or not _SYSFS_NAME.match(sysfs_name)
                ):
                    raise DriverTypesError(
                        f"{where}.sysfs_name: {sysfs_name!r} is not a driver's type name"
                    )
                table[key][int(type_id)] = RememberedType(name, sysfs_name)
        return cls(table)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DriverTypesError(f"{where}: not an object")
    return value
