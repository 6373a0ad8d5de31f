"""The cluster controller: the KubeVirt CR from every node's ``VGPUNodeState``."""
