"""GPU models and their vGPU types, loaded from the packaged CSV tables."""

from __future__ import annotations

import csv
import difflib
import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources

from vgpu_state.catalog.names import parse_type_name, short_type_name
from vgpu_state.model.ids import NVIDIA_VENDOR_ID

SYNTHETIC_TYPE_ID_BASE = 50000
"""Type ids for types whose real id is unknown are ``SYNTHETIC_TYPE_ID_BASE + n``."""

INFERRED_SUFFIX = "(inferred)"
"""How the reference table marks a model whose rows were guessed."""


@dataclass(frozen=True)
class VgpuType:
    name: str
    model: str
    series: str
    framebuffer_mib: int
    max_instances: int
    type_id: int
    type_id_known: bool
    mig_slices: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig_slices is not None


@dataclass(frozen=True)
class GpuModel:
    name: str
    device_ids: tuple[int, ...]
    framebuffer_mib: int
    subsystem_device_ids: tuple[int, ...] = ()
    sriov_totalvfs: int = 0
    """0 for GPUs without SR-IOV (vGPUs are mdevs on the PF)."""
    mdev_name_prefix: str = "NVIDIA"
    types: tuple[VgpuType, ...] = field(default=(), repr=False)
    mixed_size: str = ""
    """The driver's mixed-size (heterogeneous) mode on this model: ``""`` no,
    ``inferred`` (its generation has it; not verified on hardware)."""

    @property
    def sriov_capable(self) -> bool:
        return self.sriov_totalvfs > 0

    @property
    def inferred(self) -> bool:
        """Its rows were guessed, not taken from NVIDIA's tables (the model's name in
        the table ends in ``(inferred)``): advisory, the node's driver decides."""
        return self.name.endswith(INFERRED_SUFFIX)

    def type(self, name: str) -> VgpuType | None:
        """This model's type of that name (``NVIDIA``/``GRID`` prefixes and the ``GFX``
        config alias accepted); ``None`` when the model has none."""
        short = short_type_name(name)
        for t in self.types:
            if t.name == short:
                return t
        parsed = parse_type_name(short)
        if parsed is not None and parsed.suffix == "GFX":
            return self.type(parsed.sysfs_name)
        return None

    def offers(self, name: str) -> bool:
        return self.type(name) is not None

    @cached_property
    def short_name(self) -> str:
        """The product prefix its type names use, e.g. ``A16`` or ``T4``."""
        for t in self.types:
            parsed = parse_type_name(t.name)
            if parsed is not None and not parsed.is_mig:
                return parsed.product
        return self.name

    @cached_property
    def products(self) -> frozenset[str]:
        """Every product prefix of its type names (time-sliced and MIG-backed): ``DC``."""
        found = set()
        for t in self.types:
            parsed = parse_type_name(t.name)
            if parsed is not None:
                found.add(parsed.product)
        return frozenset(found)

    @property
    def device_filters(self) -> tuple[str, ...]:
        """vgpu-device-manager device-filter strings (``0xDDDD10DE``) for this model."""
        return tuple(f"0x{d:04X}{NVIDIA_VENDOR_ID:04X}" for d in self.device_ids)


def suggest(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``word`` ignoring case, or ``None`` if none is close."""
    by_upper = {c.upper(): c for c in candidates}
    if word.upper() in by_upper:
        return by_upper[word.upper()]
    matches = difflib.get_close_matches(word.upper(), list(by_upper), n=1, cutoff=0.6)
    return by_upper[matches[0]] if matches else None


def _read_csv(name: str) -> list[dict[str, str]]:
    text = resources.files("vgpu_state.catalog").joinpath("data", name).read_text("utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def _hex_list(text: str) -> tuple[int, ...]:
    return tuple(int(p, 16) for p in text.split("|") if p.strip())


class Catalog:
    """Lookups by PCI ids, and of types by (model, name).

    A type name is not unique across models (``DC-16Q`` is a type of the RTX PRO
    6000 and of the RTX PRO 4500, with different limits): every question about a
    type's limits names the model; :meth:`types_named` lists every model's type
    of one name.
    """

    def __init__(self, models: tuple[GpuModel, ...]) -> None:
        self.models = models
        self._by_name = {m.name: m for m in models}
        self._types: dict[str, list[VgpuType]] = {}
        self._by_id: dict[int, VgpuType] = {}
        for m in models:
            for t in m.types:
                self._types.setdefault(t.name, []).append(t)
                self._by_id.setdefault(t.type_id, t)
        shorts: dict[str, int] = {}
        for m in models:
            shorts[m.short_name.lower()] = shorts.get(m.short_name.lower(), 0) + 1
        self._unique_short = {k for k, n in shorts.items() if n == 1}

    # models ---------------------------------------------------------------
    def model(self, name: str) -> GpuModel | None:
        return self._by_name.get(name)

    def label(self, model: GpuModel) -> str:
        """How messages name a model: its short name (``T4``) where no other model
        shares it, else its full name (two models' types are named ``DC-…``)."""
        if model.short_name.lower() in self._unique_short:
            return model.short_name
        return model.name

    def find_model(self, text: str) -> GpuModel | None:
        """A model by full name (``Tesla T4``), short name (``T4``, when only one model
        has it) or device id (``0x1eb8``)."""
        wanted = text.strip()
        if wanted in self._by_name:
            return self._by_name[wanted]
        for m in self.models:
            if m.name.lower() == wanted.lower():
                return m
        if wanted.lower() in self._unique_short:
            for m in self.models:
                if m.short_name.lower() == wanted.lower():
                    return m
        if wanted.lower().startswith("0x"):
            try:
                found = self.models_for_device(int(wanted, 16))
            except ValueError:
                return None
            return found[0] if len(found) == 1 else None
        return None

    def models_for_device(self, device_id: int) -> tuple[GpuModel, ...]:
        return tuple(m for m in self.models if device_id in m.device_ids)

    def model_for_pci(self, device_id: int, subsystem_device_id: int = 0) -> GpuModel | None:
        """The model of a PF, told apart by subsystem id where device ids are shared."""
        candidates = self.models_for_device(device_id)
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        for m in candidates:
            if subsystem_device_id in m.subsystem_device_ids:
                return m
        return None

    # types ----------------------------------------------------------------
    def types_named(self, name: str) -> tuple[VgpuType, ...]:
        """Every model's type of this name (prefixes and the ``GFX`` alias accepted)."""
        short = short_type_name(name)
        found = self._types.get(short)
        if found is None:
            parsed = parse_type_name(short)
            if parsed is not None and parsed.suffix == "GFX":
                found = self._types.get(parsed.sysfs_name)
        return tuple(found or ())

    def knows(self, name: str) -> bool:
        """Some model has a type of this name."""
        return bool(self.types_named(name))

    def type(self, name: str, model: str | GpuModel | None = None) -> VgpuType | None:
        """The type of that name on ``model``; without a model, the type only when
        exactly one model has that name (else ``None``: ask with the model)."""
        if model is not None:
            m = self.model(model) if isinstance(model, str) else model
            return m.type(name) if m is not None else None
        found = self.types_named(name)
        return found[0] if len(found) == 1 else None

    def models_offering(self, name: str) -> tuple[GpuModel, ...]:
        """The models that have a type of this name, in catalog order."""
        return tuple(self._by_name[t.model] for t in self.types_named(name))

    def type_by_id(self, type_id: int) -> VgpuType | None:
        return self._by_id.get(type_id)

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(self._types)


def _load() -> Catalog:
    extras = {r["gpu_model"]: r for r in _read_csv("models.csv")}
    rows = _read_csv("vgpu-types.csv") + _read_csv("extra-types.csv")
    order: list[str] = []
    meta: dict[str, tuple[tuple[int, ...], int]] = {}
    types: dict[str, list[VgpuType]] = {}
    synthetic = SYNTHETIC_TYPE_ID_BASE
    for row in rows:
        model = row["gpu_model"]
        if model not in meta:
            order.append(model)
            meta[model] = (_hex_list(row["pci_device_id"]), int(row["framebuffer_mib"]))
            types[model] = []
        raw_id = row["type_id_example"].strip()
        if raw_id:
            type_id, known = int(raw_id.removeprefix("nvidia-")), True
        else:
            synthetic += 1
            type_id, known = synthetic, False
        parsed = parse_type_name(row["vgpu_type_name"])
        types[model].append(
            VgpuType(
                name=row["vgpu_type_name"],
                model=model,
                series=row["series"],
                framebuffer_mib=int(row["profile_framebuffer_mib"]),
                max_instances=int(row["max_instances_per_gpu"]),
                type_id=type_id,
                type_id_known=known,
                mig_slices=parsed.mig_slices if parsed else None,
            )
        )
    models = []
    for name in order:
        device_ids, fb = meta[name]
        ts = tuple(sorted(types[name], key=lambda t: (t.type_id, t.name)))
        extra = extras.get(name)
        time_sliced = [t.max_instances for t in ts if not t.is_mig]
        extra = extra or {}
        # No capture of sriov_totalvfs exists for most models; it matches the
        # largest per-GPU vGPU count (reference: nvidia-sysfs.md §2.2). A blank
        # cell of models.csv takes that default.
        raw_vfs = extra.get("sriov_totalvfs", "").strip()
        totalvfs = int(raw_vfs) if raw_vfs else max(time_sliced, default=0)
        prefix = extra.get("mdev_name_prefix", "").strip() or "NVIDIA"
        subsystems = _hex_list(extra.get("subsystem_device_ids", ""))
        mixed_size = extra.get("mixed_size", "").strip()
        models.append(
            GpuModel(
                name=name,
                device_ids=device_ids,
                framebuffer_mib=fb,
                subsystem_device_ids=subsystems,
                sriov_totalvfs=totalvfs,
                mdev_name_prefix=prefix,
                types=ts,
                mixed_size=mixed_size,
            )
        )
    return Catalog(tuple(models))


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog shipped with this version of vgpu-state (loaded once)."""
    return _load()
