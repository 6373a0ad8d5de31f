"""A fake kubelet pod-resources server: our own protos, real gRPC, a unix socket
(:func:`vgpu_state.testing.grpc_unix.unix_server`, as the other kubelet stand-ins)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from vgpu_state.kube.podresources import api_pb2, api_pb2_grpc
from vgpu_state.testing.grpc_unix import unix_server


@dataclass
class PodDevices:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: Sequence[str]


@dataclass
class PodResourcesKubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Answers ``List`` with :attr:`pods`; ``fail`` makes it answer with that status code."""

    pods: list[PodDevices] = field(default_factory=list)
    fail: grpc.StatusCode | None = None
    calls: int = 0

    def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.fail is not None:
            context.abort(self.fail, "kubelet is unhappy")
        by_pod: dict[tuple[str, str], Any] = {}
        for p in self.pods:
            pod = by_pod.get((p.namespace, p.pod))
            if pod is None:
                pod = by_pod[(p.namespace, p.pod)] = api_pb2.PodResources(
                    name=p.pod, namespace=p.namespace
                )
            container = next((c for c in pod.containers if c.name == p.container), None)
            if container is None:
                container = pod.containers.add(name=p.container)
            container.devices.add(resource_name=p.resource, device_ids=list(p.device_ids))
        return api_pb2.ListPodResourcesResponse(pod_resources=list(by_pod.values()))


@contextmanager
def serving(socket: Path, kubelet: PodResourcesKubelet) -> Iterator[PodResourcesKubelet]:
    server = unix_server(
        socket,
        lambda s: api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, s),
        workers=2,
        name="pod-resources",
    )
    try:
        yield kubelet
    finally:
        server.stop(None).wait(5)
