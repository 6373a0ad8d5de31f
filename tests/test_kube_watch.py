"""The Node watch against the Kubernetes API emulator (real HTTP, the official client).

Fault injection a real API server cannot be made to do on demand: every open
watch ended at a chosen moment, the history compacted so that a resume gets
``410 Gone``, the server's answers counted per request. The agent's watch on a
real server is exercised by ``tests/test_agent_e2e.py``.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tests.kube_emulator import RunningEmulator, WatchingApiServer
from vgpu_state.background import Backoff
from vgpu_state.kube.watch import NodeWatch

NODES = "v1/nodes"


def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


@pytest.fixture
def seen() -> queue.Queue[dict[str, str]]:
    return queue.Queue()


@pytest.fixture
def watch(kube: RunningEmulator, seen: queue.Queue[dict[str, str]]) -> Iterator[NodeWatch]:
    kube.write(NODES, "gpu-1", node("gpu-1", {"pool": "a"}))
    kube.write(NODES, "gpu-2", node("gpu-2", {"pool": "b"}))

    def record(labels: Mapping[str, str]) -> None:
        seen.put(dict(labels))

    w = NodeWatch(
        kube.api_client(), "gpu-1", record, read_timeout=5, backoff=Backoff(0.05, 0.2)
    ).start()
    yield w
    w.stop()


def next_labels(seen: queue.Queue[dict[str, str]]) -> dict[str, str]:
    return seen.get(timeout=5)


def nothing_more(seen: queue.Queue[dict[str, str]], wait: float = 0.5) -> bool:
    try:
        extra = seen.get(timeout=wait)
    except queue.Empty:
        return True
    raise AssertionError(f"unexpected callback with {extra}")


def watch_requests(kube: RunningEmulator) -> list[dict[str, str]]:
    return [dict(r.params) for r in kube.requests() if r.params.get("watch") == "true"]


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_current_labels_come_first_then_each_change(
    kube: RunningEmulator, watch: NodeWatch, seen: queue.Queue[dict[str, str]]
) -> None:
    assert next_labels(seen) == {"pool": "a"}
    kube.write(NODES, "gpu-1", {"metadata": {"labels": {"nvidia.com/vgpu.config": "x"}}})
    assert next_labels(seen) == {"pool": "a", "nvidia.com/vgpu.config": "x"}
    assert nothing_more(seen)


def test_status_updates_and_other_nodes_do_not_call_back(
    kube: RunningEmulator, watch: NodeWatch, seen: queue.Queue[dict[str, str]]
) -> None:
    assert next_labels(seen) == {"pool": "a"}
    for i in range(5):
        kube.write(NODES, "gpu-1", {"status": {"heartbeat": str(i)}})
    kube.write(NODES, "gpu-2", {"metadata": {"labels": {"pool": "c"}}})
    assert nothing_more(seen)
    # The watch kept up: its resourceVersion is the last of its node's changes.
    wait_for(lambda: watch.resource_version == str(kube.emulator.latest - 1))


def test_a_watch_that_ends_resumes_from_the_last_version_without_a_relist(
    kube: RunningEmulator, watch: NodeWatch, seen: queue.Queue[dict[str, str]]
) -> None:
    assert next_labels(seen) == {"pool": "a"}
    kube.write(NODES, "gpu-1", {"status": {"heartbeat": "1"}})
    wait_for(lambda: watch.resource_version == str(kube.emulator.latest))
    last = watch.resource_version
    kube.end_watches()
    wait_for(lambda: len(watch_requests(kube)) >= 2)
    assert watch_requests(kube)[-1]["resourceVersion"] == last
    assert watch.lists == 1
    kube.write(NODES, "gpu-1", {"metadata": {"labels": {"pool": "z"}}})
    assert next_labels(seen) == {"pool": "z"}
    assert nothing_more(seen)


def test_410_gone_relists_and_a_change_made_meanwhile_arrives_once(
    kube: RunningEmulator, watch: NodeWatch, seen: queue.Queue[dict[str, str]]
) -> None:
    assert next_labels(seen) == {"pool": "a"}
    wait_for(lambda: len(watch_requests(kube)) >= 1)
    kube.write(NODES, "gpu-1", {"metadata": {"labels": {"pool": "b"}}})
    assert next_labels(seen) == {"pool": "b"}

    # The server compacts its history past what the watch has seen and ends the stream.
    def compact(server: WatchingApiServer) -> None:
        server.compact()
        server.end_watches()

    kube.call(compact)
    kube.write(NODES, "gpu-1", {"metadata": {"labels": {"pool": "c"}}})
    wait_for(lambda: watch.lists == 2)
    assert next_labels(seen) == {"pool": "c"}
    assert nothing_more(seen)
    kube.write(NODES, "gpu-1", {"metadata": {"labels": {"pool": "d"}}})
    assert next_labels(seen) == {"pool": "d"}


def test_a_server_that_keeps_answering_410_is_not_hammered(
    kube: RunningEmulator, watch: NodeWatch, seen: queue.Queue[dict[str, str]]
) -> None:
    assert next_labels(seen) == {"pool": "a"}
    wait_for(lambda: len(watch_requests(kube)) >= 1)

    def always_gone(server: WatchingApiServer) -> None:
        server.compacted_below = 10**9
        server.end_watches()

    kube.call(always_gone)
    time.sleep(1.0)
    # Backoff between attempts (0.05 s growing to 0.2 s): a handful, not thousands.
    assert 2 <= watch.lists <= 20


def test_an_unreachable_server_is_retried_with_backoff_until_stopped() -> None:
    from vgpu_state.kube.transport import Endpoint, Transport

    errors: list[Exception] = []
    client = Transport(Endpoint(server="http://127.0.0.1:9"))
    w = NodeWatch(
        client, "gpu-1", lambda labels: None, backoff=Backoff(0.01, 0.05), on_error=errors.append
    ).start()
    try:
        wait_for(lambda: len(errors) >= 3)
    finally:
        w.stop()
    assert w._thread is not None and not w._thread.is_alive()
    assert w.labels is None


def test_keys_the_caller_writes_itself_do_not_call_back(kube: RunningEmulator) -> None:
    kube.write(NODES, "gpu-1", node("gpu-1", {"pool": "a"}))
    seen: queue.Queue[dict[str, str]] = queue.Queue()
    w = NodeWatch(
        kube.api_client(), "gpu-1", lambda labels: seen.put(dict(labels)),
        ignore=frozenset({"nvidia.com/vgpu.config.state"}),
    ).start()  # fmt: skip
    try:
        assert next_labels(seen) == {"pool": "a"}
        kube.write(NODES, "gpu-1", {"metadata": {"labels": {"nvidia.com/vgpu.config.state": "ok"}}})
        assert nothing_more(seen)
        kube.write(NODES, "gpu-1", {"metadata": {"labels": {"pool": "b"}}})
        assert next_labels(seen) == {"pool": "b"}
    finally:
        w.stop()


NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"


def test_the_nodestate_watch_tells_of_a_deletion_made_while_it_had_expired(
    kube: RunningEmulator,
) -> None:
    """Deleted while the watch was cut off and its history compacted (``410 Gone``): the
    relist that finds the object missing tells it, once. The first list finding none
    does not (the agent's first reconcile creates it), nor do the object's changes (the
    agent's own status writes). A deletion while the watch runs (its ``DELETED``
    event) is ``tests/test_control_plane_faults.py``'s, on the real server."""
    from kmock import resource

    from vgpu_state.kube.watch import NodeStateWatch

    def nodestate(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "vgpu-state.io/v1alpha1",
            "kind": "VGPUNodeState",
            "metadata": {"name": name},
            "spec": {"nodeName": name},
        }

    gone: queue.Queue[str] = queue.Queue()
    w = NodeStateWatch(
        kube.api_client(), "gpu-1", lambda: gone.put("gone"), backoff=Backoff(0.05, 0.2)
    ).start()
    try:
        wait_for(lambda: len(watch_requests(kube)) >= 1)
        kube.write(NODESTATES, "gpu-1", nodestate("gpu-1"))
        kube.write(NODESTATES, "gpu-1", {"status": {"vgpuCount": 1}})
        kube.write(NODESTATES, "gpu-2", nodestate("gpu-2"))
        wait_for(lambda: w.resource_version == str(kube.emulator.latest - 1))
        assert gone.empty() and w.lists == 1

        def delete_then_compact(server: WatchingApiServer) -> None:
            server.objects[(resource(NODESTATES), None, "gpu-1")].delete()
            server.compact()
            server.end_watches()

        kube.call(delete_then_compact)
        wait_for(lambda: w.lists == 2)
        assert gone.get(timeout=5) == "gone"
        assert nothing_more(gone)
    finally:
        w.stop()
