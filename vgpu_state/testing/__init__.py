"""Recording fakes of the ports, for tests of code that calls vgpu-state.

Like httpx's ``MockTransport``, these replace the world at a port, so a test
runs the real reconcile path without a GPU or a Kubernetes API server:

* :class:`RecordingHost` wraps any :class:`~vgpu_state.ports.HostPort` (the
  simulator's :class:`~vgpu_state.sim.host.SimHost`, typically) and records
  every driver call it forwards.
* :class:`FakeCluster` is an in-memory :class:`~vgpu_state.ports.ClusterPort`
  whose labels and holders a test changes, and which keeps every status and
  Event reported to it.
* :class:`RecordingDevicePlugin` keeps every snapshot it is refreshed with.
* :class:`MemoryClaims` holds ResourceClaims in memory for the DRA plugin;
  :func:`dra_paths` puts every path of the DRA plugin under one directory.
* :mod:`vgpu_state.testing.deviceplugin_kubelet` and
  :mod:`vgpu_state.testing.dra_kubelet` are stand-ins for the kubelet's device
  manager and DRA manager on real gRPC (each imported on its own: they load gRPC).
* :func:`settings` gives :class:`~vgpu_state.reconcile.Settings` for a test.
"""

from vgpu_state.testing.fakes import (
    FakeCluster,
    HostCall,
    MemoryClaims,
    RecordingDevicePlugin,
    RecordingHost,
    dra_paths,
)

__all__ = [
    "FakeCluster",
    "HostCall",
    "MemoryClaims",
    "RecordingDevicePlugin",
    "RecordingHost",
    "dra_paths",
]
