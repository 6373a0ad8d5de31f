"""vgpu-state: declarative desired state for NVIDIA vGPU on Kubernetes and KubeVirt nodes."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

try:
    __version__ = _installed_version("vgpu-state")
    """The installed package's version: from the git tags when it was built (setuptools-scm)."""
except PackageNotFoundError:  # pragma: no cover - run from a source tree that is not installed
    __version__ = "0.0.0+unknown"
