"""No product code is dead: vulture finds nothing unused in ``vgpu_state`` beyond
the entries below, each with the reason it stays.

Code that only the tests or the benchmarks use lives in ``vgpu_state.testing``
(not scanned) or in ``tests/``. Names that a framework calls (click commands,
pydantic validators, ``http.server`` and FUSE handlers, gRPC servicer methods)
are ignored by name or decorator, not listed one by one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import vulture

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "vgpu_state"

# Generated gRPC stubs, and the test doubles (used by tests, never by the product).
EXCLUDE = ["*_pb2.py", "*_pb2_grpc.py", "*_pb2.pyi", "*/vgpu_state/testing/*"]

# Called by a framework, never by our code.
IGNORE_DECORATORS = [
    "@*.command",
    "@*.group",
    "@field_validator",
    "@model_validator",
    "@field_serializer",
    "@model_serializer",
]
IGNORE_NAMES = [
    # pydantic
    "model_config",
    # http.server / socketserver handlers
    "do_GET",
    "do_POST",
    "log_message",
    "daemon_threads",
    "server_version",
    "protocol_version",
    "handle_error",
    "get_request",
    "close_connection",
    # click.Group hooks
    "get_command",
    "format_commands",
    # ruamel.yaml's dumper settings
    "default_flow_style",
    "sort_base_mapping_type_on_output",
    # mfusepy operations
    "use_ns",
    "init",
    "readdir",
    "truncate",
    "statfs",
    # gRPC servicer methods (the kubelet calls them)
    "Allocate",
    "GetPreferredAllocation",
    "ListAndWatch",
    "PreStartContainer",
    "GetInfo",
    "NotifyRegistrationStatus",
    "NodePrepareResources",
    "NodeUnprepareResources",
    # settings of the kubernetes client's Configuration, read by the client
    "retries",
    "connection_pool_maxsize",
    # a module's lazy attributes (PEP 562)
    "__getattr__",
    # ruamel.yaml's constructor class of a YAML instance
    "Constructor",
    # signatures fixed by the caller (signal handlers, __exit__, FUSE)
    "frame",
    "exc_type",
    "tb",
    "fi",
]

# ``file:name`` -> why it stays although nothing in vgpu_state uses it.
ALLOWED: dict[str, str] = {
    "agent/allocatable.py:evaluations": "a count the tests wait on instead of sleeping",
    "agent/allocatable.py:node_version": "the Node version seen, which the tests wait on",
    "agent/allocatable.py:nodes_seen": "a count of watched Node objects the tests wait on",
    "catalog/catalog.py:device_filters": "scripts/gen_default_config.py and bench read it",
    "kube/fleetsnapshot.py:format_version": "a field of the parsed header of a snapshot file",
    "kube/crd.py:crd": "scripts/gen_crd.py writes deploy/'s CRD with it; tests install it",
    "kube/nodestate.py:blocked_count": "a VGPUNodeState status field, written by model_dump",
    "kube/nodestate.py:document_hash": "a VGPUNodeState status field, written by model_dump",
    "kube/nodestate.py:observed_generation": "a VGPUNodeState field, written by model_dump",
    "kube/nodestate.py:vgpu_count": "a VGPUNodeState status field, written by model_dump",
    "model/plan.py:format_version": "a field of the plan's JSON, written by model_dump",
    "model/withheld.py:format_version": "a field of withheld.json, written by model_dump",
    "sim/fuse.py:mounted": "the simulator mounted for a block, for tests and benchmarks",
    "sim/tree.py:creatable_text": "the simulated creatable_vgpu_types text, its tests read it",
    # Unused since `fleet plan` streams pages (kube.fleet.fleet_pages); kept while the
    # fleet commands change, then used by them or removed.
    "cli/fleet.py:fleet_rows": "the all-at-once form of the streamed fleet table",
    "cli/fleet.py:render_table": "the all-at-once form of the streamed fleet table",
    "kube/fleet.py:read_fleet": "the all-at-once form of kube.fleet.fleet_pages",
    "reconcile/fleet.py:fleet_document": "the all-at-once form of the streamed fleet JSON",
    "reconcile/fleet.py:plan_fleet": "the all-at-once form of the streamed fleet plan",
}


def unused(package: Path = PACKAGE) -> list[str]:
    """``file:name`` of every unused definition vulture finds in ``package``."""
    v = vulture.Vulture(ignore_names=IGNORE_NAMES, ignore_decorators=IGNORE_DECORATORS)
    v.scavenge([str(package)], exclude=EXCLUDE)
    return sorted(
        f"{Path(item.filename).relative_to(package).as_posix()}:{item.name}"
        for item in v.get_unused_code(min_confidence=60)
    )


def test_no_product_code_is_unused_beyond_the_allow_list() -> None:
    found = unused()
    assert [f for f in found if f not in ALLOWED] == []


def test_every_allow_list_entry_is_still_needed_and_says_why() -> None:
    found = set(unused())
    assert [entry for entry in ALLOWED if entry not in found] == []
    assert all(len(reason) > 20 for reason in ALLOWED.values())


@pytest.mark.parametrize(
    ("module", "code", "found"),
    [
        ("planner/plan.py", "def forgotten_helper() -> int:\n    return 1", "forgotten_helper"),
        ("kube/node.py", "UNUSED_KEYS = ('a', 'b')", "UNUSED_KEYS"),
    ],
)
def test_dead_code_is_found(tmp_path: Path, module: str, code: str, found: str) -> None:
    """A definition nobody uses, added to a product module, is reported."""
    copy = tmp_path / "vgpu_state"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n\n{code}\n")
    assert unused(copy) == sorted([*unused(), f"{module}:{found}"])
