"""Which vGPU type names a config may use, and their canonical form.

The rule for a name the catalog does not know (documented in docs/config.md):

* a name the catalog knows is accepted (``NVIDIA``/``GRID`` prefixes dropped);
* a name that differs from a known one only in letter case or in look-alike
  characters (``O``/``0``, ``I``/``1``) is a misspelling: error, "did you mean";
* a grammatical name of a known product, of a kind (time-sliced or MIG-backed)
  and series the catalog lists for that product, is not a type of that product:
  error, "did you mean" the nearest type of that product;
* any other grammatical name (an unknown product such as ``M60-0Q``, or a
  series the catalog does not list for a product, such as ``T4-1B``) is
  accepted: the driver's sysfs may offer it, and the node decides;
* names in the older ``…-2B4`` form are accepted for the same reason;
* anything else is an error, with the nearest known name when one is close.
"""

from __future__ import annotations

import re
from functools import lru_cache

from vgpu_state.catalog import Catalog, default_catalog, parse_type_name, short_type_name, suggest

_LEGACY_B4 = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z][A-Za-z0-9]*)*-\d+B4$")
_LOOKALIKE = str.maketrans({"O": "0", "I": "1"})


def canonical_type_name(name: str, catalog: Catalog | None = None) -> str:
    """The name as sysfs shows it: last token, ``GFX`` alias removed, catalog spelling."""
    cat = catalog or default_catalog()
    found = cat.type(name)
    if found is not None:
        return found.name
    short = short_type_name(name)
    parsed = parse_type_name(short)
    return parsed.sysfs_name if parsed is not None else short


@lru_cache(maxsize=4)
def _index(
    catalog: Catalog,
) -> tuple[
    dict[str, str], dict[tuple[str, bool], tuple[str, ...]], dict[tuple[str, bool], set[str]]
]:
    folded: dict[str, str] = {}
    names: dict[tuple[str, bool], list[str]] = {}
    series: dict[tuple[str, bool], set[str]] = {}
    for name in catalog.type_names:
        folded[name.upper().translate(_LOOKALIKE)] = name
        parsed = parse_type_name(name)
        if parsed is None:
            continue
        key = (parsed.product, parsed.is_mig)
        names.setdefault(key, []).append(name)
        series.setdefault(key, set()).add(parsed.series)
    return folded, {k: tuple(v) for k, v in names.items()}, series


def type_name_problem(name: str, catalog: Catalog | None = None) -> str | None:
    """Why ``name`` cannot be used in ``vgpu-devices``, or ``None`` when it can."""
    cat = catalog or default_catalog()
    if cat.type(name) is not None:
        return None
    short = short_type_name(name)
    folded, by_product, series = _index(cat)
    near = folded.get(short.upper().translate(_LOOKALIKE))
    if near is not None:
        return f"unknown vGPU type {name!r}; did you mean {near}?"
    parsed = parse_type_name(short)
    if parsed is None:
        if _LEGACY_B4.match(short):
            return None
        hint = cat.suggest_type(short)
        if hint is not None:
            return f"unknown vGPU type {name!r}; did you mean {hint}?"
        return f"{name!r} is not a vGPU type name; expected a name such as A10-4Q or A100-1-5C"
    key = (parsed.product, parsed.is_mig)
    if key in by_product and parsed.series in series[key]:
        hint = suggest(short, by_product[key])
        where = f"; did you mean {hint}?" if hint else ""
        return f"unknown vGPU type {name!r}: {parsed.product} offers no such type{where}"
    return None
