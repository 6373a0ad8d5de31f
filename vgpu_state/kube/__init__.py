"""Kubernetes adapters: the Node, the KubeVirt CR, VGPUNodeState, Events, Leases, pod-resources.

This is the only package that imports ``kubernetes`` (and the kubelet's gRPC
API); it imports them lazily, inside the functions that talk to a cluster, so
importing ``vgpu_state.kube`` costs nothing until a command uses a cluster. The
requests themselves go through ``kube.transport`` (the standard library's
``http.client`` and ``ssl``); the official client's kubeconfig loader is loaded
only for a kubeconfig that needs it (``kube.credentials``).
"""
