"""ResourceSlices and ResourceClaims against kmock's emulator: what a real server cannot be.

The emulator serves whichever ``resource.k8s.io`` versions a test asks for (a
Kubernetes 1.33 server with ``v1beta2`` only, an older one with neither), which
one real API server cannot. Everything a current server can show runs on the
real one: ``tests/test_kube_dra_cluster.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra_apiserver import NODES, RunningDraApiServer, slices
from vgpu_state.catalog import default_catalog
from vgpu_state.dra.slices import build_pool
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.dra import (
    DraUnsupportedError,
    KubeClaims,
    SlicePublisher,
    resource_api_version,
)
from vgpu_state.kube.transport import Endpoint, Transport
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.host import SimHost

CATALOG = default_catalog()

MIXED = Path(__file__).resolve().parent.parent / "configs" / "sim" / "mixed.yaml"
NODE = "gpu-node-1"


def _client(url: str) -> KubeApi:
    return KubeApi(Transport(Endpoint(server=url)), url, (5.0, 10.0))


@pytest.fixture
def serve() -> Iterator[Any]:
    running: list[RunningDraApiServer] = []

    def start(versions: tuple[str, ...] = ("v1",)) -> tuple[RunningDraApiServer, KubeApi]:
        server = RunningDraApiServer(versions).start()
        running.append(server)
        server.put_object(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        return server, _client(server.url)

    yield start
    for s in reversed(running):  # kmock's resolver hooks unwind in reverse order
        s.stop()


@pytest.fixture
def mixed() -> NodeSnapshot:
    with SimHost(MIXED, in_memory=True) as host:
        return host.scan()


def test_the_newest_served_resource_version_is_used(serve: Any) -> None:
    _, client = serve(("v1beta2", "v1"))
    assert resource_api_version(client) == "v1"
    _, client = serve(("v1beta2",))
    assert resource_api_version(client) == "v1beta2"
    _, client = serve(("v1beta1",))
    with pytest.raises(DraUnsupportedError, match=r"Kubernetes 1\.33 or later"):
        resource_api_version(client)


def test_a_v1beta2_cluster_gets_v1beta2_slices(serve: Any, mixed: NodeSnapshot) -> None:
    server, client = serve(("v1beta2",))
    publisher = SlicePublisher(client, NODE)
    assert publisher.version == "v1beta2"
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    objs = server.all(slices("v1beta2"))
    assert len(objs) == 3 and {o["apiVersion"] for o in objs} == {"resource.k8s.io/v1beta2"}
    assert server.server.rejected == []


def test_dra_requests_fail_like_every_other_cluster_request(mixed: NodeSnapshot) -> None:
    """An API server that does not answer is a transient cluster error naming the request,
    the same error the rest of the agent retries on (no DRA-only error type)."""
    from vgpu_state.kube.errors import ClusterUnreachableError
    from vgpu_state.model.errors import TransientError

    api = _client("http://127.0.0.1:9")  # the discard port: nothing listens
    api.timeout = (0.5, 0.5)
    publisher = SlicePublisher(api, NODE, version="v1")
    request = r"GET /apis/resource\.k8s\.io/v1/resourceslices"
    with pytest.raises(ClusterUnreachableError, match=request) as e:
        publisher.publish(build_pool(mixed, catalog=CATALOG))
    assert isinstance(e.value, TransientError)
    with pytest.raises(ClusterUnreachableError, match="resourceclaims"):
        KubeClaims(api, version="v1").list_claims()
