"""What a node's agent withholds, as it records it for ``vgpu-state scan``.

Under ``in-use: evacuate`` the agent tells the device plugin and DRA not to offer a
GPU's free vGPUs of departing types while its layout switch is pending. ``scan``
reads no config and cannot work that out itself, so an enforcing agent records the
set (with why) in the node's state directory (``withheld.json``); ``scan`` marks the
vGPUs it still finds on the host with the same type. Pure values and their text; the
file is :mod:`vgpu_state.statefiles.withheld`.

The text is read as untrusted: nesting and value count bounded before it is parsed,
each field's type and length checked, control characters and unknown fields refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pydantic import Field, ValidationError

from vgpu_state.model import bounded
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.snapshot import NodeSnapshot, Vgpu

FORMAT_VERSION = 1
MAX_WITHHELD_VGPUS = 4096
"""At most this many vGPUs in one record (a node has far fewer)."""
MAX_REASON = 4096
"""Characters of one vGPU's reason."""
MAX_CONFIG = 253
"""Characters of a config's name."""
_MAX_VALUES = 16 * MAX_WITHHELD_VGPUS
"""JSON values one record's text may build (each vGPU has 5 fields)."""


_TEXT = r"^[^\x00-\x1f\x7f-\x9f]*$"
"""No control characters: ``scan`` prints these strings on a terminal."""


class WithheldFileError(ValueError):
    """The text is not a withheld record; the message says where and what."""


class WithheldVgpu(Frozen):
    """One free vGPU not offered while its GPU's layout switch is pending."""

    key: str = Field(min_length=1, max_length=256, pattern=_TEXT)
    """The vGPU's key (mdev UUID or VF address)."""
    gpu: str = Field(min_length=1, max_length=64, pattern=_TEXT)
    """Its GPU's PCI address."""
    type: str = Field(min_length=1, max_length=128, pattern=_TEXT)
    """Its type as the agent's scan named it (:attr:`Vgpu.type_label`)."""
    reason: str = Field(min_length=1, max_length=MAX_REASON, pattern=_TEXT)
    """Why: ``switch deferred: waits for <holders>`` or ``switch planned``."""
    config: str = Field(default="", max_length=MAX_CONFIG, pattern=_TEXT)
    """The config whose layout switch is pending."""

    def matches(self, gpu: str, vgpu: Vgpu) -> bool:
        """``vgpu`` on the GPU ``gpu`` is still the vGPU recorded (same key, GPU and type)."""
        return vgpu.key == self.key and gpu == self.gpu and vgpu.type_label == self.type


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def fitted(text: str, limit: int) -> str:
    """``text`` as a record field: control characters as ``?``, cut to ``limit``
    characters (the last one ``…`` when cut)."""
    text = _CONTROL.sub("?", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class WithheldRecord(Frozen):
    """The set an agent withholds, when it recorded it, and of which scan."""

    format_version: int = FORMAT_VERSION
    written: str = Field(max_length=64, pattern=_TEXT)
    """When the agent wrote the record (ISO 8601, UTC)."""
    snapshot_fingerprint: str | None = Field(default=None, max_length=128, pattern=_TEXT)
    """The fingerprint of the scan the agent planned from."""
    vgpus: tuple[WithheldVgpu, ...] = Field(default=(), max_length=MAX_WITHHELD_VGPUS)

    def dumps(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str) -> WithheldRecord:
        """The record of ``text``; raises :class:`WithheldFileError` on anything unexpected."""
        try:
            data = bounded.loads(text, "the withheld record", max_values=_MAX_VALUES)
        except (ValueError, RecursionError) as e:
            raise WithheldFileError(f"not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise WithheldFileError("not a withheld record (a JSON object)")
        version = data.get("format_version")
        if type(version) is not int or version != FORMAT_VERSION:
            raise WithheldFileError(f"format_version {version!r} is not {FORMAT_VERSION}")
        try:
            # The text's shape was checked above; JSON mode reads arrays as tuples.
            return cls.model_validate_json(text, strict=True)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "the record"
            more = f" and {e.error_count() - 1} more problem(s)" if e.error_count() > 1 else ""
            raise WithheldFileError(f"{where}: {err['msg']}{more}") from None


def still_on_host(record: WithheldRecord, snapshot: NodeSnapshot) -> Mapping[str, WithheldVgpu]:
    """The recorded vGPUs ``snapshot`` still shows with the same type, by key: a vGPU
    destroyed since, or created again under the same key with another type, is not
    withheld any more (the host's read wins)."""
    live = {v.key: (str(g.address), v) for g in snapshot.gpus for v in g.vgpus}
    out: dict[str, WithheldVgpu] = {}
    for w in record.vgpus:
        found = live.get(w.key)
        if found is not None and w.matches(*found):
            out[w.key] = w
    return out
