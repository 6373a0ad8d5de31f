"""The fleet view: the plan ``vgpu-state fleet plan`` makes, made by the controller.

The leader plans every node that reports a ``VGPUNodeState`` against the layouts the
agents read (the same ConfigMap, mounted), with the node's live labels, exactly as
``fleet plan`` does (:func:`vgpu_state.reconcile.fleet.plan_node` over
:func:`vgpu_state.kube.fleet.fleet_pages`), and keeps only the totals: they become
the controller's ``vgpu_state_fleet_*`` metrics (:mod:`vgpu_state.controller.metrics`).
Reads only; one list of Nodes and one paged list of ``VGPUNodeState`` per view.
"""

from __future__ import annotations

import datetime as dt

from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.fleet import DEFAULT_CHUNK_SIZE, fleet_pages, reported_nodes
from vgpu_state.kube.nodestate import SnapshotDecoder
from vgpu_state.ports.config import ConfigSource
from vgpu_state.reconcile.fleet import FleetSummary, Totals, plan_node
from vgpu_state.reconcile.settings import Settings


def fleet_totals(
    api: KubeApi,
    layouts: ConfigSource,
    settings: Settings,
    now: dt.datetime,
    max_age: dt.timedelta | None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Totals:
    """What ``fleet plan -f LAYOUTS --max-age MAX_AGE`` totals, node by node."""
    document = layouts.document()
    labels, pages = fleet_pages(api, chunk_size)
    decoder = SnapshotDecoder()
    summary = FleetSummary()
    for page in pages:
        for node in reported_nodes(page, labels, decoder):
            summary.add(plan_node(document, node, settings, now, max_age))
    return summary.totals()
