"""The fleet view: the plan ``vgpu-state fleet plan`` makes, made by the controller.

The leader plans every node that reports a ``VGPUNodeState`` against the layouts the
agents read (the same ConfigMap, mounted), with the node's live labels, exactly as
``fleet plan`` does (:func:`vgpu_state.reconcile.fleet.plan_node` over
:func:`vgpu_state.kube.fleet.reported_node`, each object decoded as it arrives:
:func:`vgpu_state.kube.liststream.stream_objects`), and keeps only the totals: they become
the controller's ``vgpu_state_fleet_*`` metrics (:mod:`vgpu_state.controller.metrics`).
Reads only; one list of Nodes' metadata and one paged list of ``VGPUNodeState`` per view.
"""

from __future__ import annotations

import datetime as dt

from vgpu_state.kube import nodestate
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.fleet import DEFAULT_CHUNK_SIZE, read_labels, reported_node
from vgpu_state.kube.liststream import stream_objects
from vgpu_state.kube.nodestate import SnapshotDecoder
from vgpu_state.ports.config import ConfigSource
from vgpu_state.reconcile.fleet import FleetSummary, Totals, plan_node
from vgpu_state.reconcile.settings import Settings

VIEW_CHUNK = 50
"""``VGPUNodeState`` objects per list request of a view: each is planned as it is decoded,
while its page is read."""
DECODER_BUDGET = 1024 * 1024
"""Bytes of GPUs' JSON whose decoded GPUs a view shares between nodes."""


def fleet_totals(
    api: KubeApi,
    layouts: ConfigSource,
    settings: Settings,
    now: dt.datetime,
    max_age: dt.timedelta | None,
    chunk_size: int = VIEW_CHUNK,
) -> Totals:
    """What ``fleet plan -f LAYOUTS --max-age MAX_AGE`` totals, node by node."""
    document = layouts.document()
    labels = read_labels(api, DEFAULT_CHUNK_SIZE)
    decoder = SnapshotDecoder(DECODER_BUDGET)
    summary = FleetSummary()
    for obj in stream_objects(api, nodestate.object_path(), chunk_size):
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            node = reported_node(name, obj, labels.get(name), decoder)
            del obj
            summary.add(plan_node(document, node, settings, now, max_age))
            del node  # before the next one is decoded
    return summary.totals()
