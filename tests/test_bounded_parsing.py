"""Deeply nested input at every entry point of untrusted YAML and JSON: a clean error
naming the limit, never a dead process.

ruamel's C composer recursed once per nesting level on the C stack, so 30,000 ``[`` in a
layouts file killed ``vgpu-state validate``, the agent and the controller's webhook with
SIGSEGV; the JSON readers raised a ``RecursionError`` their callers did not expect. Each
entry point here runs in a child process over nestings of 1,000 to 1,000,000 levels, so a
crash is a failed test naming the case, not a dead pytest.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgpu_state.model import bounded

REPO = Path(__file__).resolve().parent.parent
DEPTHS = (1_000, 30_000, 100_000, 1_000_000)
DEPTH_LIMIT = "nested more than 64 levels deep"
SIZE_LIMIT = "more than the limit of"

# The nestings, built in the child: YAML flow and block styles; JSON arrays and objects
# (JSON is YAML too, so the YAML readers get those as well).
SHAPES = """
SHAPES = {
    "flow [": lambda n: "[" * n + "]" * n,
    "flow {": lambda n: "{a: " * n + "}" * n,
    "block - ": lambda n: "- " * n + "x\\n",
    "block indent": lambda n: "".join(" " * i + f"k{i}:\\n" for i in range(min(n, 3000))),
    "json [": lambda n: "[" * n + "]" * n,
    "json {": lambda n: '{"a":' * n + "}" * n,
}
"""
YAML_SHAPES = ("flow [", "flow {", "block - ", "block indent", "json [", "json {")
JSON_SHAPES = ("json [", "json {")

# Each entry point: setup code, then the body of ``def read(text, tmp) -> str`` that
# returns the error message (an exception's text counts as its message).
ENTRY_POINTS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "config text (vgpu-state validate, the fleet view)": (
        YAML_SHAPES,
        "from vgpu_state.config import load_text",
        "load_text(text, 'config.yaml', catalog=CATALOG)",
    ),
    "config file (the agent's mounted ConfigMap, the controller's fleet view)": (
        YAML_SHAPES,
        "from vgpu_state.config import FileConfigSource",
        "path = tmp / 'config.yaml'; path.write_text(text); "
        "FileConfigSource(path, CATALOG).document()",
    ),
    "webhook review of a layouts ConfigMap": (
        YAML_SHAPES,
        "from vgpu_state.controller.webhook import review",
        "body = {'request': {'uid': 'u', 'operation': 'UPDATE', "
        "'object': {'data': {'config.yaml': text}}}}; "
        "return review(body, CATALOG)['response']['status']['message']",
    ),
    "simulator spec": (
        YAML_SHAPES,
        "from vgpu_state.sim.spec import parse_spec",
        "parse_spec(text, 'node.yaml', catalog=CATALOG)",
    ),
    "saved plan": (
        JSON_SHAPES,
        "from vgpu_state.planner.saved import parse_saved_plan",
        "parse_saved_plan(text.encode(), 'plan.json')",
    ),
    "in-use list": (
        ("json {",),
        "from vgpu_state.inputfiles import parse_in_use_list",
        "parse_in_use_list(text, 'held.json')",
    ),
    "driver-types table": (
        JSON_SHAPES,
        "from vgpu_state.model.drivertypes import DriverTypes",
        "DriverTypes.parse(text)",
    ),
    "a node's snapshot in its VGPUNodeState status": (
        JSON_SHAPES,
        "import base64, gzip\n"
        "from vgpu_state.kube.nodestate import ReportedSnapshot, decode_snapshot",
        "data = base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode(); "
        "decode_snapshot(ReportedSnapshot(fingerprint='f', scanned_at='t', data=data))",
    ),
    "fleet snapshot file (vgpu-state fleet --snapshot)": (
        JSON_SHAPES,
        "from vgpu_state.kube.fleetsnapshot import SnapshotReader",
        "path = tmp / 'fleet.jsonl'; path.write_text(text + '\\n'); "
        "SnapshotReader(str(path)).open()",
    ),
    "the API server's list of VGPUNodeStates (fleet view, fleet plan)": (
        JSON_SHAPES,
        "from vgpu_state.kube.fleet import page_items",
        "page_items(('{\"items\": [' + text + ']}').encode())",
    ),
    "any API server answer": (
        JSON_SHAPES,
        "from vgpu_state.kube.api import _decode",
        "_decode(text.encode())",
    ),
}

CHILD = """
import faulthandler, sys, tempfile
from pathlib import Path
faulthandler.enable()
from vgpu_state.catalog import default_catalog
CATALOG = default_catalog()
{shapes}
{setup}

def read(text, tmp):
    {body}
    return "(accepted)"

for shape in {shapes_used!r}:
    for n in {depths!r}:
        print("CASE", shape, n, flush=True)
        text = SHAPES[shape](n)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                message = read(text, Path(tmp))
            except BaseException as e:
                message = type(e).__name__ + ": " + str(e)
        print("SAID", shape, n, " ".join(str(message).split())[:300], flush=True)
"""


def run_child(shapes: tuple[str, ...], setup: str, body: str) -> subprocess.CompletedProcess[str]:
    code = CHILD.format(
        shapes=SHAPES, setup=setup, body=body, shapes_used=shapes, depths=DEPTHS
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_deep_nesting_is_a_clean_error_naming_the_limit(entry: str) -> None:
    shapes, setup, body = ENTRY_POINTS[entry]
    done = run_child(shapes, setup, body)
    started = [line for line in done.stdout.splitlines() if line.startswith("CASE ")]
    assert done.returncode == 0, (
        f"{entry}: the process died ({done.returncode}) in {started[-1:]}:\n{done.stderr[-2000:]}"
    )
    said = [line for line in done.stdout.splitlines() if line.startswith("SAID ")]
    assert len(said) == len(shapes) * len(DEPTHS)
    for line in said:
        _, rest = line.split(" ", 1)
        # A text whose nesting is past the limit is refused for it; the largest texts may
        # meet an entry point's size or count limit first, which names its limit as well.
        ok = DEPTH_LIMIT in rest or (SIZE_LIMIT in rest or "larger than" in rest)
        ok = ok or bool(re.search(r"JSON (objects|values); at most \d+ are read", rest))
        assert ok, f"{entry}: {rest}"
        assert "RecursionError" not in rest and "Traceback" not in rest


@pytest.mark.parametrize("depth", [30_000, 100_000, 1_000_000])
def test_validate_refuses_deep_nesting_naming_the_limit(tmp_path: Path, depth: int) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * depth)  # 1,000,000 levels: 1 MB, under the 4 MiB file limit
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", "validate", "-f", str(deep)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.perf_counter() - start
    assert done.returncode == 1, done.stderr
    assert f"{deep}:1:65: {DEPTH_LIMIT}" in done.stderr
    # The acceptance is 1 s on a quiet machine (bench/RESULTS.md); a loaded one gets room.
    assert took < 10, took


def test_the_deepest_nesting_the_limit_allows_is_read() -> None:
    bounded.loads("[" * 64 + "]" * 64, "x")
    with pytest.raises(bounded.InputShapeError, match=r"^x:1:65: nested more than 64"):
        bounded.loads("[" * 65 + "]" * 65, "x")
    from vgpu_state.config.yamlnodes import YamlProblem, compose_text

    assert compose_text("[" * 64 + "]" * 64) is not None
    # Block style: line L opens a list and a mapping, levels 2L - 2 and 2L - 1 (the top
    # mapping is level 1); level 65 is the mapping on line 33.
    with pytest.raises(YamlProblem) as e:
        compose_text("a:\n" + "".join("  " * i + f"- k{i}:\n" for i in range(40)))
    assert (e.value.line, e.value.message) == (33, bounded.depth_message())


def test_brackets_inside_json_strings_do_not_count() -> None:
    text = json.dumps({"a": "[" * 1000, "b": "]" * 1000 + "\\\"[[", "c": [[[1]]]})
    assert bounded.json_depth_offset(text) is None
    hidden = '{"a": "]]]]", "b": ' + "[" * 70 + "]" * 70 + "}"
    assert bounded.json_depth_offset(hidden) == hidden.index("[") + 63


def test_a_string_left_open_is_scanned_once() -> None:
    """``"\\"\\"\\"…`` never closed: a search that restarted at every quote took 20 s
    for 20,000 of them (quadratic); this is 1,000,000 (it would take days)."""
    for tail in ("", "\\"):
        text = "[" * 100 + '"' + '\\"' * 1_000_000 + tail
        assert bounded.json_depth_offset(text) == 64
        with pytest.raises(bounded.InputShapeError, match="1:65: nested more than 64"):
            bounded.loads(text, "x")


def test_an_alias_bomb_is_refused_by_its_expanded_size() -> None:
    from vgpu_state.config.yamlnodes import YamlProblem, compose_text

    levels = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    with pytest.raises(YamlProblem) as e:
        compose_text("\n".join(levels))
    # a4 repeats 66,430 nodes; the second alias of it on line 6 (a5) passes 150,000.
    assert "more than 150000 YAML nodes" in e.value.message
    assert (e.value.line, e.value.column) == (6, 14)


def test_a_large_text_the_c_parser_refuses_is_not_parsed_again_by_the_slow_one() -> None:
    """A 0.9 MiB flow list the C parser refuses took the pure-Python parser 15.8 s of
    CPU for its message; above 256 KiB the C parser's message is used. (Short items
    now meet the node limit first: these are long, 9,000 of them.)"""
    from vgpu_state.config.yamlnodes import YamlProblem, compose_text

    text = "[" + ("a" * 100 + ",") * 9000
    start = time.process_time()
    with pytest.raises(YamlProblem) as e:
        compose_text(text)
    assert e.value.message.startswith("not valid YAML: ")
    assert time.process_time() - start < 5  # it was 15.8 s
