"""A gRPC server on a unix socket: how each kubelet stand-in serves."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc


def unix_server(
    socket_path: str | Path,
    add_servicers: Callable[[Any], None],
    *,
    workers: int = 4,
    name: str = "kubelet",
) -> Any:
    """A started ``grpc.Server`` on ``socket_path`` with the servicers ``add_servicers``
    puts on it; ``stop()`` it when done."""
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name))
    add_servicers(server)
    if not server.add_insecure_port(f"unix:{socket_path}"):
        raise OSError(f"cannot serve gRPC on {socket_path}")
    server.start()
    return server
