"""vgpu-state: declarative desired state for NVIDIA vGPU on Kubernetes and KubeVirt nodes."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``__version__``: the installed package's version (pyproject.toml's, the one version
    string of docs/release.md); read from the package's metadata when first asked for."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        version = installed_version("vgpu-state")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree that is not installed
        version = "0.0.0+unknown"
    globals()["__version__"] = version
    return version
