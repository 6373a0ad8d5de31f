"""Policy knobs of a config (``policy:`` at top level and per config).

Semantics (documented in docs/config.md):

* ``in-use: protect`` (default): a vGPU that a pod or VM holds is never destroyed;
  the step becomes a *blocked* item naming the holder. ``ignore`` plans as if
  nothing were in use (the driver may still refuse with EBUSY).
* ``prune: true`` (default): the layout is the whole desired state of a GPU it
  covers; vGPUs it does not want are destroyed (still subject to ``in-use``).
  ``false`` makes layouts additive: unwanted vGPUs are left in place and
  reported, and steps that need their capacity are blocked.
* ``publish: device-plugin`` (default): the GPU's vGPUs are advertised by the
  kubelet device plugin; ``dra``: they are published as ResourceSlice devices
  for Dynamic Resource Allocation instead. A vGPU is offered through exactly
  one of the two. Settable at top level, per config and per entry.
* ``sriov: auto`` (default): enable the VFs of a GPU whose VFs are off when the
  layout needs them. ``off``: never touch SR-IOV; such GPUs are blocked.
  VFs are never disabled while they hold vGPUs, under any policy.
* ``missing-gpus: skip`` (default): an entry whose ``devices`` or ``device-filter``
  select no GPU of the node (an index past its GPUs) is skipped and the plan lists it;
  ``error`` makes it an error, as ``--strict`` does.
* ``max-unavailable: 1`` (default): how many nodes the agents let apply a
  disruptive plan (one that destroys a vGPU) at the same time; each takes one
  of this many rollout slots first. Plans that only create need no slot.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from vgpu_state.model.frozen import Frozen


class InUsePolicy(StrEnum):
    PROTECT = "protect"
    IGNORE = "ignore"
    EVACUATE = "evacuate"


class SriovPolicy(StrEnum):
    AUTO = "auto"
    OFF = "off"


class Publish(StrEnum):
    """Through which channel the kubelet is offered a GPU's vGPUs."""

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


class MissingGpus(StrEnum):
    """What an entry that selects no GPU of the node does: skip it (listed) or fail."""

    SKIP = "skip"
    ERROR = "error"


class Evacuation(Frozen):
    """The limits of ``in-use: evacuate`` (the ``evacuation:`` block of a policy).

    Under ``evacuate`` a held vGPU is protected as under ``protect``; in addition the
    free vGPUs of the departing types of a GPU whose switch is pending are withheld
    (not offered to the kubelet), and the controller moves the VMs in the way.
    """

    max_in_flight: int = 1
    """VMs moving at once, fleet-wide (the top-level policy's value; 0: withhold, move none)."""
    max_per_node: int = 1
    """VMs moving off one node at once."""
    timeout_seconds: int = 600
    """A move not finished by then counts as failed (``timeout: 10m`` in the file)."""
    restart: bool = False
    """A VM that cannot live-migrate may be restarted elsewhere (its VMI deleted, so
    KubeVirt starts it again where a vGPU of its type is free)."""


class Policy(Frozen):
    in_use: InUsePolicy = InUsePolicy.PROTECT
    prune: bool = True
    sriov: SriovPolicy = SriovPolicy.AUTO
    max_unavailable: int = 1
    publish: Publish = Publish.DEVICE_PLUGIN
    missing_gpus: MissingGpus = MissingGpus.SKIP
    evacuation: Evacuation = Field(default=Evacuation(), exclude_if=lambda v: v == Evacuation())
    """``in-use: evacuate``'s limits; left out of a plan's JSON while they are the defaults."""
