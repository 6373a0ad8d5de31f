"""Fuzzing the readers of untrusted input: only typed errors, never a traceback, never a write.

``make test`` runs a short pass; ``make fuzz`` runs many more examples
(``VGPU_STATE_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text
from vgpu_state.host.scan import parse_creatable_vgpu_types, scan
from vgpu_state.model.errors import ConfigError
from vgpu_state.planner.saved import SavedPlanError, parse_saved_plan
from vgpu_state.statefiles import Journal

CATALOG = default_catalog()

# A warning from a library (ruamel's ReusedAnchorWarning was one) is a problem the
# reader failed to turn into a located error: it fails the test.
pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("error")]

EXAMPLES = int(os.environ.get("VGPU_STATE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
REPO = Path(__file__).resolve().parent.parent

# YAML-ish text: the config language's keys and values, YAML punctuation, noise.
_TOKENS = st.sampled_from(
    [
        "version: v1\n", "vgpu-configs:\n", "  a:\n", "    - devices: all\n",
        "      vgpu-devices:\n", "        A2-4Q: 4\n", "        A2-4Q: \n", "devices: [0, 1]\n",
        "device-filter: 0x25B610DE\n", "node-selectors:\n", "  - config: a\n",
        "    match-labels: {k: v}\n", "default: a\n", "policy: {prune: false}\n", "&x ", "*x",
        "<<: *x\n", "{", "}", "[", "]", ": ", "- ", "\t", "'", '"', "!!str ", "!!python/object ",
        "%YAML 1.2\n---\n", "\n", "    ", "9" * 5000, "\x00", "\ufeff",
    ]
)
yaml_text = st.one_of(st.lists(_TOKENS, max_size=40).map("".join), st.text(max_size=300))


@FUZZ
@given(yaml_text)
@example("a: &x 1\nb: &x 2\n")
@example("&x [&x [[")
def test_config_loader_raises_only_config_errors(text: str) -> None:
    try:
        load_text(text, "fuzz.yaml", catalog=CATALOG)
    except ConfigError as e:
        for issue in e.issues:
            assert issue.line >= 1 and issue.column >= 1


def _saved_plan_document() -> dict[str, Any]:
    path = REPO / "tests" / "golden" / "plan-mixed.json"
    plan = json.loads(path.read_text())
    return {
        "kind": "vgpu-state-saved-plan",
        "plan": plan,
        "desired": {"node": "n", "config": "c", "selection_source": "flag"},
        "snapshot": {"gpus": []},
        "in_use": {},
        "host": {"sim": None, "sysfs_root": None},
    }


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


def _mutate(doc: Any, path: list[int], value: Any) -> Any:
    """Replace one value somewhere in ``doc`` (chosen by ``path``) with ``value``."""
    if not path or not isinstance(doc, dict | list) or not doc:
        return value
    if isinstance(doc, dict):
        keys = sorted(doc)
        key = keys[path[0] % len(keys)]
        return {**doc, key: _mutate(doc[key], path[1:], value)}
    i = path[0] % len(doc)
    return [*doc[:i], _mutate(doc[i], path[1:], value), *doc[i + 1 :]]


@FUZZ
@given(st.lists(st.integers(min_value=0, max_value=50), max_size=6), _JSON)
def test_saved_plan_loader_raises_only_saved_plan_errors(path: list[int], value: Any) -> None:
    doc = _mutate(_saved_plan_document(), path, value)
    with contextlib.suppress(SavedPlanError):
        parse_saved_plan(json.dumps(doc).encode(), "fuzz.json")


@FUZZ
@given(st.binary(max_size=400))
def test_saved_plan_loader_takes_any_bytes(data: bytes) -> None:
    with contextlib.suppress(SavedPlanError):
        parse_saved_plan(data, "fuzz.json")


_RECORD_LINE = st.one_of(
    st.binary(max_size=60),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {
            "event": st.sampled_from(["plan-start", "action", "plan-end", "x"]),
            "plan_id": st.one_of(st.text(max_size=4), st.integers()),
        },
        optional={
            "ts": st.one_of(
                st.floats(allow_nan=True), st.integers(), st.text(max_size=3), st.none()
            ),
            "actions": st.one_of(st.integers(), st.text(max_size=3), st.none()),
            "address": st.one_of(st.text(max_size=8), st.none()),
            "outcome": st.sampled_from(["converged", "partial", "failed", "ok"]),
            "node": st.text(max_size=4),
        },
    ).map(lambda v: json.dumps(v).encode()),
)


@FUZZ
@given(st.lists(_RECORD_LINE, max_size=12))
def test_journal_reader_never_raises(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "journal.jsonl"
        path.write_bytes(b"\n".join(lines))
        journal = Journal(path)
        records = list(journal.records())
        journal.unfinished()
        journal.applies()
        assert all(isinstance(r, dict) for r in records)


@FUZZ
@given(st.text(max_size=300))
def test_creatable_types_parser_never_raises(text: str) -> None:
    for type_id, name in parse_creatable_vgpu_types(text):
        assert isinstance(type_id, int) and isinstance(name, str)


_ATTRIBUTES = ["vendor", "class", "device", "subsystem_device", "sriov_totalvfs",
               "sriov_numvfs", "numa_node", "current_vgpu_type", "available_instances",
               "name", "creatable_vgpu_types"]
_VALUES = st.one_of(
    st.sampled_from(["0x10de\n", "0x030200\n", "0x25b6\n", "16\n", "0\n", "-1\n", "x\n",
                     "9" * 5000, "746 : NVIDIA A2-4Q\n", ""]),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
_NODE = st.tuples(
    st.sampled_from(["bus/pci/devices/0000:08:00.0", "bus/pci/devices/0000:08:00.4",
                     "bus/pci/devices/0000:08:00.0/mdev_supported_types/nvidia-746",
                     "bus/pci/devices/0000:08:00.4/nvidia",
                     "bus/pci/devices/0000:08:00.0/f715f63c-0d00-4007-9c5a-b07b0c6c05de"]),
    st.sampled_from([*_ATTRIBUTES, "driver", "physfn", "virtfn0", "mdev_type", "iommu_group"]),
    _VALUES,
    st.booleans(),
)


@FUZZ
@given(st.lists(_NODE, max_size=25))
def test_scan_of_a_random_tree_never_raises_and_never_writes(
    entries: list[tuple[str, str, str, bool]],
) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "bus" / "pci" / "devices").mkdir(parents=True)
        for directory, name, value, as_link in entries:
            where = root / directory
            where.mkdir(parents=True, exist_ok=True)
            target = where / name
            if target.exists() or target.is_symlink():
                continue
            if as_link:
                target.symlink_to(value.replace("\x00", "").strip()[:50] or "missing")
            else:
                target.write_text(value, encoding="latin-1")
        before = _tree(root)
        snapshot = scan(str(root), "fuzz", catalog=CATALOG)
        assert _tree(root) == before
        assert snapshot.node == "fuzz"


def _tree(root: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = p.lstat()
            found[str(p)] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return found
