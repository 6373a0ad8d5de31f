"""Errors of the cluster adapters: each says what failed and what to do next."""

from __future__ import annotations

from vgpu_state.model.errors import Reason, TransientError, UserError, VgpuStateError


class ClusterError(UserError):
    """The Kubernetes API refused a request for a reason a retry will not fix.

    ``status`` is the HTTP status, ``api_reason`` the API server's reason
    (``NotFound``, ``Forbidden``, ``Invalid``, ...).
    """

    default_reason = Reason.CLUSTER_REFUSED

    def __init__(self, message: str, status: int = 0, api_reason: str = "") -> None:
        self.status = status
        self.api_reason = api_reason
        super().__init__(message)


class ClusterUnreachableError(TransientError):
    """The Kubernetes API server could not be reached (or its config could not be loaded)."""

    default_reason = Reason.CLUSTER_UNREACHABLE


class ContendedWriteError(TransientError):
    """A guarded write kept losing to concurrent writers; retry later.

    Raised after the writer retried each :class:`~vgpu_state.kube.api.ConflictError`
    (one HTTP 409) it got, up to its limit."""

    default_reason = Reason.CLUSTER_CONFLICT


class NotFoundError(ClusterError):
    """The object does not exist (HTTP 404)."""


class PodResourcesUnavailableError(VgpuStateError):
    """The kubelet's pod-resources socket is missing or does not answer.

    Without it nothing is known about which vGPUs pods hold: ``apply`` must not
    destroy anything, and ``plan`` reports in-use as unknown.
    """

    default_reason = Reason.IN_USE_UNKNOWN

    def __init__(self, socket: str, detail: str) -> None:
        self.socket = socket
        self.detail = detail
        super().__init__(
            f"kubelet pod-resources API at {socket}: {detail}; which vGPUs pods hold is unknown "
            "(is the kubelet running, and is its pod-resources directory mounted here?)"
        )
