"""vGPU type-name grammar.

Accepted forms (the sysfs ``name`` file, config keys, and NVIDIA's docs):

* ``A10-4Q``, ``NVIDIA A10-4Q``, ``GRID T4-1Q``: the product prefix is dropped,
  only the last whitespace-separated token is the type (as NVIDIA's own tools do);
* multi-word products: ``NVIDIA RTX Pro 6000 Blackwell DC-3Q`` → ``DC-3Q``;
* hyphenated products: ``RTX5000-Ada-4Q``;
* framebuffer ``0`` (512 MiB): ``M60-0Q``;
* MIG-backed: ``A100-1-5C``, ``DC-1-24Q``, with suffix ``ME``, ``NOME``, ``MEALL``
  or ``GFX`` (``GFX`` is a config alias; sysfs never shows it).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_TIME_SLICED = re.compile(
    r"^(?P<product>[A-Za-z0-9]+(?:-[A-Za-z][A-Za-z0-9]*)*)-(?P<gb>\d+)(?P<series>[ABCQ])$"
)
_MIG = re.compile(
    r"^(?P<product>[A-Za-z0-9]+)-(?P<slices>\d+)-(?P<gb>\d+)(?P<series>[ABCQ])"
    r"(?P<suffix>ME|NOME|MEALL|GFX)?$"
)


@dataclass(frozen=True)
class ParsedTypeName:
    name: str
    """The canonical short name, e.g. ``A10-4Q`` (``GFX`` suffix kept)."""
    product: str
    framebuffer_gb: int
    """0 means 512 MiB."""
    series: str
    mig_slices: int | None = None
    suffix: str = ""

    @property
    def is_mig(self) -> bool:
        return self.mig_slices is not None

    @property
    def sysfs_name(self) -> str:
        """The name as sysfs shows it: the ``GFX`` config alias has no suffix there."""
        return self.name[: -len("GFX")] if self.suffix == "GFX" else self.name


def type_sort_key(name: str, framebuffer_mib: int | None = None) -> tuple[int, str]:
    """Order of types in lists: framebuffer size, then name (``L40S-1A`` before ``L40S-12A``).

    ``framebuffer_mib`` when known, else the size the name states; unparsable names last.
    """
    if framebuffer_mib is None:
        parsed = parse_type_name(name)
        if parsed is not None:
            framebuffer_mib = parsed.framebuffer_gb * 1024 or 512
    return (framebuffer_mib if framebuffer_mib is not None else 1 << 30, name)


def short_type_name(text: str) -> str:
    """Drop a product prefix (``NVIDIA``, ``GRID``, multi-word) and surrounding space."""
    tokens = text.strip().split()
    return tokens[-1] if tokens else ""


@functools.lru_cache(maxsize=4096)
def parse_type_name(text: str) -> ParsedTypeName | None:
    """Parse a type name; ``None`` when it does not follow the grammar (still usable).

    Remembered by text (the result is frozen): a fleet's nodes name the same few types
    in every plan."""
    name = short_type_name(text)
    m = _MIG.match(name)
    if m:
        return ParsedTypeName(
            name=name,
            product=m.group("product"),
            framebuffer_gb=int(m.group("gb")),
            series=m.group("series"),
            mig_slices=int(m.group("slices")),
            suffix=m.group("suffix") or "",
        )
    m = _TIME_SLICED.match(name)
    if m:
        return ParsedTypeName(
            name=name,
            product=m.group("product"),
            framebuffer_gb=int(m.group("gb")),
            series=m.group("series"),
        )
    return None
