#!/usr/bin/env python3
"""Write the checked-in Python stubs of every gRPC API vgpu-state speaks.

The kubelet's device plugin API, its DRA and plugin-registration APIs and its
pod-resources API: each ``.proto`` is our copy of the wire contract, and the
``api_pb2.py``, ``api_pb2.pyi`` and ``api_pb2_grpc.py`` beside it are what
grpcio-tools (a test dependency, never needed at run time) makes of it.
``python scripts/gen_protos.py`` rewrites them in place; the test suite
regenerates them into a temporary directory and fails when they differ.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent.parent
PROTOS = (
    Path("vgpu_state/deviceplugin/v1beta1/api.proto"),
    Path("vgpu_state/dra/pluginregistration/api.proto"),
    Path("vgpu_state/dra/v1/api.proto"),
    Path("vgpu_state/dra/v1beta1/api.proto"),
    Path("vgpu_state/kube/podresources/api.proto"),
)
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: Path) -> dict[Path, str]:
    """Run protoc (grpcio-tools) on every ``.proto``; generated text by repository path."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    found: dict[Path, str] = {}
    for proto in PROTOS:
        args = [
            "grpc_tools.protoc",
            f"-I{SOURCE_ROOT}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto),
        ]
        status = protoc.main(args)
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status} on {proto}")
        for name in GENERATED:
            found[proto.parent / name] = (out_dir / proto.parent / name).read_text(encoding="utf-8")
    return found


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
    for path, text in files.items():
        (SOURCE_ROOT / path).write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
