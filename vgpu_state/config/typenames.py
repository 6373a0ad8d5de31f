"""Which vGPU type names a config may use, and their canonical form.

The driver decides which types exist; the catalog advises. The rule for a name
(documented in docs/config.md):

* a name the catalog knows is accepted (``NVIDIA``/``GRID`` prefixes dropped);
* stray spaces around a name, or spaces that split it where no product prefix
  ends (``" A100-5C"``, ``"A100- 1-5C"``), are errors with the name written
  without them suggested;
* a name that differs from a known one only in letter case or in look-alike
  characters (``O``/``0``, ``I``/``1``) is a misspelling: error, "did you mean";
* any other grammatical name (``A10-5Q``, ``T4-1B``, a newer driver's type, a
  product the catalog does not know such as ``M60-0Q``) and names in the older
  ``…-2B4`` form are accepted with a **warning**: the node's driver decides
  whether it offers the type; ``validate --strict`` makes the warning an error;
* anything else is an error.

Every "did you mean" for an unknown name comes from one rule, :func:`near_names`:
the catalog's names of the same product within a small edit distance (the
nearest framebuffer size breaking ties), or no suggestion at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from vgpu_state.catalog import Catalog, parse_type_name, short_type_name

_LEGACY_B4 = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z][A-Za-z0-9]*)*-\d+B4$")
_LOOKALIKE = str.maketrans({"O": "0", "I": "1"})


def canonical_type_name(name: str, catalog: Catalog) -> str:
    """The name as sysfs shows it: last token, ``GFX`` alias removed, catalog spelling."""
    found = catalog.types_named(name)
    if found:
        return found[0].name
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


MAX_EDITS = 2
"""The most single-character edits between an unknown name and a suggested one."""
MAX_SUGGESTIONS = 3


def _edits(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _product_of(short: str) -> str:
    """The product part of a name that may not parse: up to its last ``-`` and digits."""
    parsed = parse_type_name(short)
    if parsed is not None:
        return parsed.product
    legacy = legacy_product(short)
    if legacy is not None:
        return legacy
    return re.split(r"[-_ ]\d", short, maxsplit=1)[0]


def near_names(name: str, catalog: Catalog) -> tuple[str, ...]:
    """The catalog's names ``name`` most likely misspells: those of its product (letter
    case ignored) at the fewest edits, at most :data:`MAX_EDITS`; among several, those
    of the nearest framebuffer size; none when more than :data:`MAX_SUGGESTIONS` remain."""
    short = short_type_name(name)
    product = _product_of(short).upper()
    candidates = [n for n in catalog.type_names if _product_of(n).upper() == product]
    if not candidates:
        return ()
    scored = [(_edits(short.upper(), n.upper()), n) for n in candidates]
    best = min(d for d, _ in scored)
    if best > MAX_EDITS:
        return ()
    nearest = [n for d, n in scored if d == best]
    parsed = parse_type_name(short)
    if parsed is not None and len(nearest) > 1:
        size = parsed.framebuffer_gb

        def gap(n: str) -> int:
            other = parse_type_name(n)
            return abs(other.framebuffer_gb - size) if other is not None else 1 << 20

        closest = min(gap(n) for n in nearest)
        nearest = [n for n in nearest if gap(n) == closest]
    unique = tuple(dict.fromkeys(nearest))
    return unique if len(unique) <= MAX_SUGGESTIONS else ()


def did_you_mean(name: str, catalog: Catalog) -> str:
    """``; did you mean A2-2Q or A2-4Q?``, or ``""`` (:func:`near_names`)."""
    names = near_names(name, catalog)
    if not names:
        return ""
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" or {names[-1]}"
    return f"; did you mean {listed}?"


@dataclass(frozen=True)
class TypeNameNote:
    """What the config checks say about one type name."""

    message: str
    warning: bool
    """True: the name may be right (the driver decides); False: it is an error."""


def legacy_product(name: str) -> str | None:
    """The product of an older ``…-2B4`` name (``T4`` of ``T4-2B4``), else ``None``."""
    short = short_type_name(name)
    if not _LEGACY_B4.match(short):
        return None
    return short.rsplit("-", 1)[0]


def name_product(name: str) -> str | None:
    """The product part of a type name (``A10`` of ``A10-4Q``), grammatical or legacy."""
    parsed = parse_type_name(name)
    return parsed.product if parsed is not None else legacy_product(name)


def _spacing_problem(name: str, cat: Catalog) -> str | None:
    """Stray spaces, or spaces that split a name where no product prefix ends."""
    tokens = name.split()
    joined = "".join(tokens)
    grammatical = cat.knows(joined) or parse_type_name(joined) is not None
    hint_name = joined if grammatical and joined != name else None
    hint = f"; did you mean {hint_name}?" if hint_name else ""
    if name != name.strip():
        return f"vGPU type {name!r} has stray spaces{hint}"
    if len(tokens) > 1 and (
        any(t.endswith("-") for t in tokens[:-1]) or tokens[-1].startswith("-")
    ):
        return f"vGPU type {name!r} has a malformed product part (a space inside the name){hint}"
    parsed = parse_type_name(tokens[-1]) if tokens else None
    if parsed is not None and not any(ch.isalpha() for ch in parsed.product):
        return f"vGPU type {name!r} has a malformed product part {parsed.product!r}{hint}"
    return None


def type_name_note(name: str, catalog: Catalog) -> TypeNameNote | None:
    """Why ``name`` cannot be used, or should be looked at; ``None`` when it is known.

    Answered once per (catalog, name): a layouts file names the same types in many
    entries, and a name the catalog does not know is compared with every known name."""
    return _type_name_note(catalog, name)


@lru_cache(maxsize=4096)
def _type_name_note(cat: Catalog, name: str) -> TypeNameNote | None:
    spacing = _spacing_problem(name, cat)
    if spacing is not None:
        return TypeNameNote(spacing, warning=False)
    if cat.knows(name):
        return None
    short = short_type_name(name)
    folded, by_product, _ = _index(cat)
    near = folded.get(short.upper().translate(_LOOKALIKE))
    if near is not None:
        return TypeNameNote(f"unknown vGPU type {name!r}; did you mean {near}?", warning=False)
    parsed = parse_type_name(short)
    if parsed is None:
        if _LEGACY_B4.match(short):
            return TypeNameNote(
                f"vGPU type {name!r} is not in the catalog; the node's driver decides "
                "whether it offers it",
                warning=True,
            )
        hint = did_you_mean(name, cat)
        why = hint or ": not a vGPU type name (such as A10-4Q or A100-1-5C)"
        return TypeNameNote(f"unknown vGPU type {name!r}{why}", warning=False)
    key = (parsed.product, parsed.is_mig)
    if key in by_product:
        hint = did_you_mean(name, cat).removeprefix("; ")
        return TypeNameNote(
            f"vGPU type {name!r} is not in the catalog's {parsed.product} types"
            f"{f' ({hint})' if hint else ''}; the node's driver decides whether it offers it",
            warning=True,
        )
    return TypeNameNote(
        f"vGPU type {name!r} is not in the catalog; the node's driver decides whether it offers it",
        warning=True,
    )


def type_name_problem(name: str, catalog: Catalog) -> str | None:
    """Why ``name`` cannot be used in ``vgpu-devices`` (an error), or ``None`` when it can."""
    note = type_name_note(name, catalog)
    return None if note is None or note.warning else note.message
