"""Reading a fleet's reports fast gives what reading them the careful way gives.

``fleet plan`` reads each list page with pydantic's JSON parser (the standard one
for what that refuses); validates each status as it is, and only when that fails
reads it without what this version does not know (a newer agent's fields and
condition types); shares decoded GPUs between nodes; and checks a scan's PCI
addresses once per set of GPUs and VF lists. Each shortcut must give the same plan
input and the same reason for an unknown node as the careful way.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from typing import Any

import pytest

from tests.test_fleet_stream import BENCH, SCANNED
from vgpu_state.kube.errors import ClusterError
from vgpu_state.kube.fleet import page_items, reported_node
from vgpu_state.kube.nodestate import (
    SnapshotDecodeError,
    SnapshotDecoder,
    VGPUNodeStateStatus,
    decode_snapshot,
    encode_snapshot,
    known_status,
)
from vgpu_state.model.fleet import ReportedNode, UnknownReason
from vgpu_state.model.snapshot import NodeSnapshot, SharedParts, Vgpu, scan_problem


@functools.cache
def _states(count: int = 17) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """The benchmark fleet's first ``count`` nodes (never changed: tests change copies)."""
    return [
        (state["metadata"]["name"], node["metadata"]["labels"], state)
        for node, state in BENCH.fleet_items(count, SCANNED)
    ]


def _careful(name: str, state: dict[str, Any], labels: dict[str, str]) -> ReportedNode:
    """``reported_node`` as it read every status: without the unknown parts, always."""
    known = copy.deepcopy(state)
    known["status"] = known_status(state["status"])
    return reported_node(name, known, labels, SnapshotDecoder())


def test_a_newer_agent_s_status_is_planned_as_this_version_reads_it() -> None:
    """Fields and condition types this version does not know, at every level, are
    ignored: the node is planned against the same scan as without them."""
    for name, labels, state in _states():
        newer = copy.deepcopy(state)
        status = newer["status"]
        status["placementHints"] = {"numa": [0, 1]}
        status["conditions"] = [
            {"type": "Migrating", "status": "True", "reason": "Later", "lastTransitionTime": "x"}
        ]
        status["gpus"][0]["vgpus"][0]["migratable"] = True
        status["snapshot"]["signature"] = "ed25519:..."
        node = reported_node(name, newer, labels, SnapshotDecoder())
        assert node.unknown is None
        assert node == reported_node(name, state, labels, SnapshotDecoder())
        assert node == _careful(name, newer, labels)


def test_an_invalid_status_from_a_newer_agent_gives_the_same_reason_as_before() -> None:
    """The reason names the invalid field, not the unknown one (the error of the status
    without the unknown fields, as before)."""
    name, labels, state = _states(1)[0]
    bad = copy.deepcopy(state)
    bad["status"]["vgpuCount"] = "many"
    bad["status"]["placementHints"] = {"numa": [0, 1]}
    node = reported_node(name, bad, labels, SnapshotDecoder())
    assert node.unknown is not None
    assert node.unknown.reason is UnknownReason.STATUS_UNREADABLE
    assert node.unknown.message == (
        "status.vgpuCount: Input should be a valid integer, unable to parse string as an integer"
    )
    assert node == _careful(name, bad, labels)
    # A field under both its JSON name and its Python name: the JSON name's value, as before.
    both = copy.deepcopy(state)
    both["status"]["inUseKnown"] = False
    both["status"]["in_use_known"] = True
    node = reported_node(name, both, labels, SnapshotDecoder())
    assert node.unknown is None and node.in_use_known is False
    assert node == _careful(name, both, labels)


def _whole_fingerprint(scan: NodeSnapshot) -> str:
    text = json.dumps(scan.stable_view(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    "type_name",
    ["A16-2Q", 'A16 "2Q"', "A16\\2Q", "A16-2Q ✓", "A16\t2Q", "A16\x7f2Q", "", "~ !#[]"],
)
def test_the_fingerprint_is_the_sha256_of_the_stable_view_whatever_the_names(
    type_name: str,
) -> None:
    """Names that JSON escapes (quotes, backslashes, non-ASCII, control characters) give
    the hash of ``json.dumps`` of the stable view, as names that it does not."""
    scans = [decode_snapshot(_reported(s)) for _, _, s in _states()]
    for scan in scans:
        gpu = scan.gpus[-1]
        if not gpu.vgpus:
            continue
        renamed = tuple(
            v.model_copy(update={"type_name": type_name, "uuid": v.uuid and v.uuid + type_name})
            for v in gpu.vgpus
        )
        changed = scan.with_gpus((*scan.gpus[:-1], gpu.with_vgpus(renamed)))
        assert changed.fingerprint() == _whole_fingerprint(changed)
        back = SnapshotDecoder().decode(encode_snapshot(changed, SCANNED))
        assert back == changed and back.fingerprint() == changed.fingerprint()


def _reported(state: dict[str, Any]) -> Any:
    return VGPUNodeStateStatus.model_validate(state["status"]).snapshot


def test_a_copy_with_other_gpus_or_vgpus_is_what_model_copy_makes() -> None:
    scan = decode_snapshot(_reported(_states(1)[0][2]))
    gpu = scan.gpus[0]
    vgpus = (Vgpu(kind="vf", parent=gpu.vfs[-1].address, type_id=1, type_name="x"),)
    for made, expected in (
        (gpu.with_vgpus(vgpus), gpu.model_copy(update={"vgpus": vgpus})),
        (scan.with_gpus(scan.gpus[1:]), scan.model_copy(update={"gpus": scan.gpus[1:]})),
    ):
        assert made == expected and type(made) is type(expected)
        assert made.model_fields_set == expected.model_fields_set
        assert made.model_dump_json(exclude_unset=True) == expected.model_dump_json(
            exclude_unset=True
        )
    fewer = scan.with_gpus(scan.gpus[1:])
    assert fewer.fingerprint() == _whole_fingerprint(fewer) != scan.fingerprint()
    assert scan.fingerprint() == _whole_fingerprint(scan)


def test_nodes_with_the_same_gpu_text_share_the_decoded_gpu() -> None:
    """A GPU whose vGPUs are VFs is the same text on every node of a model with the same
    layout: decoded once, one object. A GPU holding mdevs is not (their UUIDs are the
    node's own): what precedes its vGPUs is shared."""
    decoder = SnapshotDecoder()
    with SharedParts.remembering():
        scans = [decoder.decode(_reported(s)) for _, _, s in _states(48)]
    whole: dict[str, Any] = {}
    base: dict[str, Any] = {}
    same = different = 0
    for scan in scans:
        for gpu in scan.gpus:
            first = whole.setdefault(gpu.model_dump_json(), gpu)
            if first is not gpu:
                assert first == gpu
                same += 1
            shared = base.setdefault(gpu.model_dump_json(exclude={"vgpus"}), gpu)
            if shared is not gpu and shared.vgpus != gpu.vgpus:
                assert shared.vfs is gpu.vfs and shared.offered is gpu.offered
                different += 1
    # Every repeated text was the same object (``first is gpu`` above, but the first).
    assert same == 0 and different > 0
    assert sum(len(s.gpus) for s in scans) > len(whole)


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind":"VGPUNodeStateList","items":[{"metadata":{"name":"n"},"status":{}}]}',
        # What pydantic's parser refuses and the standard one reads: read as before.
        b'{"items":[{"metadata":{"name":"n\\ud800"}}]}',
        b'\xef\xbb\xbf{"items":[{"metadata":{"name":"n"}}]}',
        b'{"items":[' + b"[" * 60 + b"]" * 60 + b',{"metadata":{"name":"n"}}]}',
        b'{"items":[{"metadata":{"name":"n"},"a":1,"a":' + b"9" * 5000 + b"}]}",
        b'{"items":[{"metadata":{"name":"n"},"n":[1e400,-0,0.1,NaN,123456789012345678901]}]}',
    ],
)
def test_a_list_page_is_read_as_the_standard_json_parser_reads_it(body: bytes) -> None:
    try:
        expected: Any = json.loads(body)
    except ValueError as e:
        with pytest.raises(ClusterError, match="the API server sent a list that is not JSON"):
            page_items(body)
        assert str(e)
        return
    items = [i for i in expected["items"] if isinstance(i, dict)]
    assert repr(page_items(body)) == repr(items)


def test_a_list_page_nested_deeper_than_the_limit_is_an_error_naming_the_limit() -> None:
    # pydantic's parser stops at 200 levels, the standard one would go on to ~1,000 and
    # hand back an object every recursive reader of it would have to survive.
    body = b'{"items":[' + b"[" * 300 + b"]" * 300 + b',{"metadata":{"name":"n"}}]}'
    with pytest.raises(ClusterError) as e:
        page_items(body)
    assert str(e.value).startswith(
        "the API server sent a list that cannot be read: the list:1:73: "
        "nested more than 64 levels deep"
    )


def test_a_list_page_that_is_not_json_is_an_error_naming_the_place() -> None:
    with pytest.raises(ClusterError) as e:
        page_items(b'{"items":[{"metadata":{"name":"n"}}]')
    assert str(e.value) == (
        "the API server sent a list that is not JSON: "
        "Expecting ',' delimiter: line 1 column 37 (char 36)"
    )


def test_repeated_addresses_are_found_whichever_scans_were_checked_before() -> None:
    """The check is remembered per set of GPU addresses and VF lists: a scan that repeats
    a node's GPUs is refused after the node's own scan was accepted, and the other way."""
    decoder = SnapshotDecoder()
    with SharedParts.remembering():
        scans = [decoder.decode(_reported(s)) for _, _, s in _states(48)]
        for scan in scans:
            twice = scan.with_gpus(scan.gpus * 2)
            # The second GPU at the first one's address: the same VF lists, other addresses.
            moved = scan.with_gpus(
                (
                    *scan.gpus[:1],
                    *(
                        g.model_copy(update={"address": scan.gpus[0].address})
                        for g in scan.gpus[1:2]
                    ),
                )
            )
            for _ in range(2):
                assert scan_problem(scan.node, scan) is None
                problem = scan_problem(scan.node, twice)
                assert problem is not None and problem.startswith("its scan repeats PCI addresses")
                assert (scan_problem(scan.node, moved) is None) == (len(scan.gpus) == 1)


def _page(items: list[Any]) -> bytes:
    return json.dumps(
        {"kind": "VGPUNodeStateList", "apiVersion": "v1", "metadata": {}, "items": items}
    ).encode()


def test_a_page_s_statuses_validated_from_its_text_give_what_each_object_gives() -> None:
    """A list page's statuses are validated straight from the response's text; every
    kind of status (none, empty, not an object, a newer agent's, an invalid one, a good
    one) gives the node the per-object reading gives, with the same reason."""
    from vgpu_state.kube.fleet import _checked_page, reported_nodes

    items: list[Any] = []
    labels: dict[str, dict[str, str]] = {}
    for i, (name, node_labels, state) in enumerate(_states()):
        item = copy.deepcopy(state)
        labels[name] = node_labels
        status = item["status"]
        if i == 1:
            item["status"] = {}
        elif i == 2:
            item["status"] = None
        elif i == 3:
            del item["status"]
        elif i == 4:
            item["status"] = ["not", "an", "object"]
        elif i == 5:
            status["placementHints"] = {"numa": [0, 1]}  # a newer agent's
        elif i == 6:
            status["vgpuCount"] = "many"
        elif i == 7:
            status["snapshot"]["data"] = "not base64!"
        elif i == 8:
            status["gpus"][0]["vgpus"][0]["holder"] = "pod vms/virt-launcher-x"
        elif i == 9:
            item["metadata"]["name"] = ""
        elif i == 10:
            del labels[name]
        items.append(item)
    page = _page(items)
    checked = _checked_page(page)
    assert checked is not None and len(checked) == len(items)  # read from the text
    by_object = [
        reported_node(obj["metadata"]["name"], obj, labels.get(obj["metadata"]["name"]))
        for obj in page_items(page)
        if obj["metadata"]["name"]
    ]
    with SharedParts.remembering():
        from_text = list(reported_nodes(page, labels, SnapshotDecoder()))
    assert from_text == by_object
    reasons = {n.name: n.unknown.reason for n in from_text if n.unknown is not None}
    assert reasons[items[1]["metadata"]["name"]] is UnknownReason.NO_STATUS
    assert reasons[items[4]["metadata"]["name"]] is UnknownReason.NO_STATUS
    assert reasons[items[6]["metadata"]["name"]] is UnknownReason.STATUS_UNREADABLE
    assert reasons[items[7]["metadata"]["name"]] is UnknownReason.SNAPSHOT_UNREADABLE
    assert reasons[items[10]["metadata"]["name"]] is UnknownReason.NODE_MISSING
    assert items[5]["metadata"]["name"] not in reasons
    held = next(n for n in from_text if n.name == items[8]["metadata"]["name"])
    assert "pod vms/virt-launcher-x" in held.in_use.values()


def test_a_page_whose_items_do_not_read_as_objects_is_read_object_by_object() -> None:
    """An item or metadata that is not an object: the page is read as before (such
    items skipped), with the same nodes."""
    from vgpu_state.kube.fleet import _checked_page, reported_nodes

    (name, node_labels, state), *_ = _states(2)
    page = _page([state, 7, {"metadata": None}, {"metadata": {"name": 5}, "status": {}}])
    assert _checked_page(page) is None
    nodes = list(reported_nodes(page, {name: node_labels}, SnapshotDecoder()))
    assert nodes == [reported_node(name, state, node_labels)]


def test_a_scan_that_differs_from_one_decoded_only_by_its_node_s_name_decodes_as_alone() -> None:
    """A scan without mdev UUIDs (VFs holding types) is decoded once per text but for the
    node's name: another node's copy gets its own name, the same GPUs and fingerprint as
    a decode of its own, and a wrong fingerprint is still refused."""
    scan = NodeSnapshot.model_validate_json(
        decode_snapshot(_reported(_vendor_state())).model_dump_json()
    )
    assert scan.gpus and all(v.uuid is None for g in scan.gpus for v in g.vgpus)
    decoder = SnapshotDecoder()
    first = decoder.decode(encode_snapshot(scan.model_copy(update={"node": "n-1"}), SCANNED))
    for name in ("n-2", "nœud-3", 'n\\"4'):
        alone = scan.model_copy(update={"node": name})
        got = decoder.decode(encode_snapshot(alone, SCANNED))
        assert got == decode_snapshot(encode_snapshot(alone, SCANNED)) == alone
        assert got.node == name and got.fingerprint() == alone.fingerprint()
    assert got.gpus == first.gpus
    wrong = encode_snapshot(scan.model_copy(update={"node": "n-5"}), SCANNED)
    wrong = wrong.model_copy(update={"fingerprint": "sha256:" + "0" * 64})
    with pytest.raises(SnapshotDecodeError, match="fingerprint"):
        decoder.decode(wrong)


def _vendor_state() -> dict[str, Any]:
    """The status of the benchmark fleet's first node whose vGPUs are VFs (no UUIDs)."""
    for _, _, state in _states():
        if state["status"]["gpus"][0]["layout"] == "vendor-vfio":
            return state
    raise AssertionError("no vendor-VFIO node")


def test_an_mdev_gpu_whose_text_differs_in_place_from_one_decoded_is_decoded_as_alone() -> None:
    """What precedes an mdev GPU's vGPUs is found by its first bytes and length and then
    compared whole: a GPU of the same length whose VFs differ further on (another IOMMU
    group) is decoded as it is, not taken for the one decoded before."""
    scan = next(
        scan
        for scan in (decode_snapshot(_reported(s)) for _, _, s in _states())
        if any(g.vfs and g.vgpus and g.vgpus[0].uuid for g in scan.gpus)
    )
    gpu = next(g for g in scan.gpus if g.vfs and g.vgpus and g.vgpus[0].uuid)
    vf = gpu.vfs[-1]
    assert vf.iommu_group is not None
    other_vf = vf.model_copy(update={"iommu_group": vf.iommu_group + 1})
    if len(str(other_vf.iommu_group)) != len(str(vf.iommu_group)):
        other_vf = vf.model_copy(update={"iommu_group": vf.iommu_group - 1})
    other_gpu = gpu.model_copy(update={"vfs": (*gpu.vfs[:-1], other_vf)})
    other = scan.model_copy(update={"gpus": tuple(other_gpu if g is gpu else g for g in scan.gpus)})
    decoder = SnapshotDecoder()
    first = decoder.decode(encode_snapshot(scan, SCANNED))
    second = decoder.decode(encode_snapshot(other, SCANNED))
    assert first == scan and second == other
    assert second.gpu(gpu.address) == other_gpu != first.gpu(gpu.address)
    again = decoder.decode(encode_snapshot(scan, SCANNED))
    assert again == scan and decoder.shared > 0
