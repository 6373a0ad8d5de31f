"""vgpu-state: declarative desired state for NVIDIA vGPU on Kubernetes and KubeVirt nodes."""

__version__ = "0.1.0.dev0"
