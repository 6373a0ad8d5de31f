"""Generate the checked-in Python stubs of the device plugin API from ``api.proto``.

``python -m vgpu_state.deviceplugin.protos`` rewrites them in place; the test
suite regenerates them into a temporary directory and fails when they differ.
Generation needs ``grpcio-tools`` (a test dependency), never the plugin itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent.parent
PROTO = Path("vgpu_state/deviceplugin/v1beta1/api.proto")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: Path) -> dict[str, str]:
    """Run protoc (grpcio-tools) on ``api.proto``; the generated files by name."""
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
    target = out_dir / PROTO.parent
    return {name: (target / name).read_text(encoding="utf-8") for name in GENERATED}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
    for name, text in files.items():
        (SOURCE_ROOT / PROTO.parent / name).write_text(text, encoding="utf-8")
        print(f"wrote {PROTO.parent / name}")


if __name__ == "__main__":
    main()
