"""Generate the checked-in Python stubs of the kubelet's pod-resources API.

``python -m vgpu_state.kube.podresources.protos`` rewrites ``api_pb2.py``,
``api_pb2.pyi`` and ``api_pb2_grpc.py`` from ``api.proto`` next to them; a test
regenerates them into a temporary directory and fails when they differ.
Generation needs ``grpcio-tools`` (a test dependency), never the client.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent.parent.parent
PROTO = Path("vgpu_state/kube/podresources/api.proto")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: Path) -> dict[Path, str]:
    """Run protoc (grpcio-tools) on ``api.proto``; generated text by repository path."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    args = [
        "grpc_tools.protoc",
        f"-I{SOURCE_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO),
    ]
    status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status} on {PROTO}")
    return {
        PROTO.parent / name: (out_dir / PROTO.parent / name).read_text(encoding="utf-8")
        for name in GENERATED
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
    for path, text in files.items():
        (SOURCE_ROOT / path).write_text(text, encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
