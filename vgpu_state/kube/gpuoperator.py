"""NVIDIA's GPU Operator on this node: its sandbox operands paused around a change of vGPUs.

Under the GPU Operator, the operator's sandbox device plugin advertises the
node's vGPUs and its sandbox validator checks them. Both are DaemonSets that run
on a node only while its label ``nvidia.com/gpu.deploy.<operand>`` is ``true``.
They learn the node's vGPUs when they start, so around any change of the host
(vGPUs created or destroyed, SR-IOV turned on) they are stopped and started
again, the way NVIDIA's vgpu-device-manager does it:

1. each of the two labels whose value is ``true`` is set to
   ``paused-for-vgpu-change`` (a label that is absent, ``false`` or paused by
   someone else is left as it is); in the same write, the Node's annotation
   ``vgpu-state.io/paused-operands`` records which labels this agent paused;
2. the operands' pods on the node (``app=nvidia-sandbox-device-plugin-daemonset``,
   ``app=nvidia-sandbox-validator`` in the GPU Operator's namespace) are awaited
   until none is left, for at most :data:`POD_TIMEOUT` seconds; when they do
   not go, the labels are restored and the change does not start;
3. after the change (applied, failed or interrupted) every recorded label that
   is still ``paused-for-vgpu-change`` goes back to ``true`` and the annotation
   is removed, in one write.

The annotation lives on the Node, so it survives the agent's restart and the
node's reboot: an agent that starts and finds it restores the labels first
(:meth:`SandboxOperands.recover`). A change that has nothing to do touches no
label.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_state.kube.api import JsonObject, KubeApi, path_of, retry_on_conflict
from vgpu_state.kube.errors import ContendedWriteError
from vgpu_state.kube.node import annotations_of, labels_of, node_path
from vgpu_state.model.errors import TransientError

log = logging.getLogger(__name__)

SANDBOX_DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.sandbox-device-plugin"
SANDBOX_VALIDATOR_LABEL = "nvidia.com/gpu.deploy.sandbox-validator"
DEPLOYED = "true"
PAUSED = "paused-for-vgpu-change"
"""The value vgpu-device-manager gives the labels during a change (the operands'
nodeSelectors want ``true``, so their pods leave the node)."""
PAUSED_ANNOTATION = "vgpu-state.io/paused-operands"
"""The labels this agent paused and has not restored yet (comma-separated keys)."""
DEFAULT_NAMESPACE = "gpu-operator"
POD_TIMEOUT = 120.0
"""Seconds the operands' pods get to leave the node (as vgpu-device-manager waits)."""
POD_POLL = 1.0


@dataclass(frozen=True)
class Operand:
    """One of the GPU Operator's sandbox operands: its node label and its pods."""

    name: str
    label: str
    pod_selector: str


OPERANDS = (
    Operand(
        "sandbox device plugin",
        SANDBOX_DEVICE_PLUGIN_LABEL,
        "app=nvidia-sandbox-device-plugin-daemonset",
    ),
    Operand("sandbox validator", SANDBOX_VALIDATOR_LABEL, "app=nvidia-sandbox-validator"),
)
_KNOWN = {o.label for o in OPERANDS}
_MAX_RECORD = 512
"""Characters of the annotation read at most (the two keys need under 100)."""


class OperandsNotStoppedError(TransientError):
    """The operands' pods did not leave the node in time; nothing was changed."""


# pure ------------------------------------------------------------------------------------
def recorded(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The labels the annotation says this agent paused: only the two known keys count
    (anything else in it is ignored), in the order of :data:`OPERANDS`."""
    raw = annotations.get(PAUSED_ANNOTATION)
    if raw is None:
        return ()
    names = {part.strip() for part in raw[:_MAX_RECORD].split(",")}
    ignored = sorted(n for n in names - _KNOWN if n)
    if ignored or len(raw) > _MAX_RECORD:
        log.warning(
            "annotation %s: only %s are restored; ignored %r",
            PAUSED_ANNOTATION,
            " and ".join(sorted(_KNOWN)),
            ignored or raw[_MAX_RECORD:][:60],
        )
    return tuple(o.label for o in OPERANDS if o.label in names)


def pause_patch(labels: Mapping[str, str], annotations: Mapping[str, str]) -> JsonObject | None:
    """The merge patch that pauses the operands deployed now (label ``true``) and records
    them with those already recorded; ``None`` when there is nothing to write."""
    already = recorded(annotations)
    to_pause = [o.label for o in OPERANDS if labels.get(o.label) == DEPLOYED]
    if not to_pause:
        return None
    record = [o.label for o in OPERANDS if o.label in to_pause or o.label in already]
    return {
        "metadata": {
            "labels": dict.fromkeys(to_pause, PAUSED),
            "annotations": {PAUSED_ANNOTATION: ",".join(record)},
        }
    }


def restore_patch(labels: Mapping[str, str], annotations: Mapping[str, str]) -> JsonObject | None:
    """The merge patch that sets every recorded label still ``paused-for-vgpu-change``
    back to ``true`` and drops the record; ``None`` when nothing is recorded.

    A recorded label someone changed meanwhile (to ``false``, say) is left as it is."""
    if PAUSED_ANNOTATION not in annotations:
        return None
    restore = [label for label in recorded(annotations) if labels.get(label) == PAUSED]
    metadata: dict[str, Any] = {"annotations": {PAUSED_ANNOTATION: None}}
    if restore:
        metadata["labels"] = dict.fromkeys(restore, DEPLOYED)
    return {"metadata": metadata}


# the cluster -------------------------------------------------------------------------------
class SandboxOperands:
    """Pauses and restores the GPU Operator's sandbox operands on ``node``."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        namespace: str = DEFAULT_NAMESPACE,
        timeout: float = POD_TIMEOUT,
        poll: float = POD_POLL,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.node = node
        self.namespace = namespace
        self.timeout = timeout
        self.poll = poll
        self._sleep = sleep
        self._clock = clock

    def pause(self, stopping: Callable[[], bool] = lambda: False) -> bool:
        """Pause the deployed operands, then wait until their pods have left the node;
        ``False`` (the labels restored) when ``stopping()`` turned true meanwhile.

        Raises :class:`OperandsNotStoppedError` (after restoring the labels) when pods
        are still there after :attr:`timeout` seconds."""
        if self._write(pause_patch):
            log.info("paused the GPU Operator's sandbox operands on %s for a change", self.node)
        deadline = self._clock() + self.timeout
        for operand in OPERANDS:
            while pods := self._pods(operand):
                if stopping():
                    self.restore()
                    return False
                if self._clock() >= deadline:
                    self.restore()
                    names = ", ".join(sorted(pods)[:5])
                    raise OperandsNotStoppedError(
                        f"the GPU Operator's {operand.name} did not leave node {self.node} "
                        f"within {self.timeout:g} s of its label {operand.label} being set "
                        f"to {PAUSED} (pods {operand.pod_selector} in namespace "
                        f"{self.namespace}: {names}); nothing was changed, the labels are "
                        "restored and the change is retried"
                    )
                self._sleep(self.poll)
        return True

    def restore(self) -> bool:
        """Restore the labels this agent recorded as paused; ``True`` when it wrote."""
        wrote = self._write(restore_patch)
        if wrote:
            log.info("restored the GPU Operator's sandbox operands on %s", self.node)
        return wrote

    def recover(self) -> bool:
        """At start: the labels a previous run paused and did not restore (it was killed,
        or the node rebooted) go back; ``True`` when it wrote."""
        wrote = self.restore()
        if wrote:
            log.warning(
                "the GPU Operator's sandbox operands on %s were left paused by an earlier "
                "run (annotation %s); restored them",
                self.node,
                PAUSED_ANNOTATION,
            )
        return wrote

    def _write(
        self, make: Callable[[Mapping[str, str], Mapping[str, str]], JsonObject | None]
    ) -> bool:
        """Read the Node and merge-patch what ``make`` wants, guarded by the version read."""
        path = node_path(self.node)

        def attempt() -> bool:
            node = self.api.get(path)
            patch = make(labels_of(node), annotations_of(node))
            if patch is None:
                return False
            version = (node.get("metadata") or {}).get("resourceVersion")
            if version:
                patch["metadata"]["resourceVersion"] = version
            self.api.patch(path, patch, "merge")
            return True

        return retry_on_conflict(
            attempt,
            5,
            ContendedWriteError(f"node {self.node}: the GPU Operator's labels kept changing"),
        )

    def _pods(self, operand: Operand) -> list[str]:
        items = self.api.list(
            path_of("", "v1", "pods", namespace=self.namespace),
            label_selector=operand.pod_selector,
            field_selector=f"spec.nodeName={self.node}",
        )
        return [str((p.get("metadata") or {}).get("name", "?"))[:253] for p in items]


__all__ = [
    "DEFAULT_NAMESPACE",
    "OPERANDS",
    "PAUSED",
    "PAUSED_ANNOTATION",
    "SANDBOX_DEVICE_PLUGIN_LABEL",
    "SANDBOX_VALIDATOR_LABEL",
    "OperandsNotStoppedError",
    "SandboxOperands",
    "pause_patch",
    "restore_patch",
]
