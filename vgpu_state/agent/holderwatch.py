"""A deferred layout switch is retried as soon as its holder goes, not on the resync timer.

A switch a holder blocks keeps the GPU's layout (``docs/plan.md``, "Deferred
switches"). When the VM stops, nothing the agent watches changes (no config,
no label, and inotify does not see sysfs), so without this the switch would
wait for the next resync. While the last plan has a deferred switch, this
thread re-reads the holders every few seconds, the same way every plan reads
them (the kubelet's pod-resources, the in-use file, the node's processes), and
asks for a reconcile (``Trigger.HOLDERS``) when the set of held vGPUs
differs from the one that plan was made with. Reading the holders costs one
pod-resources call: no scan, no plan, no API write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from vgpu_state.background import BackgroundLoop, positive

DEFAULT_HOLDER_POLL_SECONDS = 5.0

log = logging.getLogger(__name__)


class HolderWatch(BackgroundLoop):
    """Every ``interval`` seconds, call ``fire`` when ``changed()`` says the holders moved.

    ``changed`` answers ``False`` cheaply when no switch is deferred; it may
    raise (a holder source that cannot be read): the next tick asks again.
    """

    def __init__(
        self,
        changed: Callable[[], bool],
        fire: Callable[[], None],
        interval: float = DEFAULT_HOLDER_POLL_SECONDS,
    ) -> None:
        self._interval = positive("holder poll interval", interval)
        self._changed = changed
        self._fire = fire
        super().__init__("vgpu-state-holder-watch", first=interval)

    def step(self) -> float:
        try:
            moved = self._changed()
        except Exception as e:  # a holder source down now may answer next time
            log.debug("holders could not be read: %s", e)
            return self._interval
        if moved:
            log.info("the holders of this node's vGPUs changed; reconciling")
            self._fire()
        return self._interval
