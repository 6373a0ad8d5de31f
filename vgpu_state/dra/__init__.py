"""Dynamic Resource Allocation: vGPUs as ResourceSlice devices, prepared for KubeVirt.

``slices`` (the pool built from a snapshot), ``claims`` (claims as values, the
lookup protocol, claims as in-use holders) and ``prepare`` (CDI specs,
device metadata, checkpoint) are plain Python; only ``plugin`` imports gRPC,
so nothing that does not serve the kubelet loads it.
"""
