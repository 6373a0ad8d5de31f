"""The controller's fleet view keeps of each Node only the labels a config is selected by.

Whoever can write a Node's labels (its own kubelet among them) must not grow the
controller's memory with labels no layout reads.
"""

from __future__ import annotations

import datetime as dt

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text
from vgpu_state.controller.fleetcache import FleetCache, selection_keys
from vgpu_state.reconcile.settings import Settings

DOC = """\
version: v1
vgpu-configs:
  a2: [{devices: all, vgpu-devices: {A2-4Q: 4}}]
node-selectors:
  - match-labels: {pool: vdi}
    match-expressions: [{key: zone, operator: In, values: [a]}]
    config: a2
"""


def test_selection_keys_are_the_config_label_and_the_selectors_keys() -> None:
    document = load_text(DOC, "layouts.yaml", catalog=default_catalog())
    assert selection_keys(document, "nvidia.com/vgpu.config") == {
        "nvidia.com/vgpu.config",
        "nvidia.com/vgpu.config.state",
        "pool",
        "zone",
    }


def test_a_node_with_thousands_of_labels_keeps_only_those() -> None:
    document = load_text(DOC, "layouts.yaml", catalog=default_catalog())
    cache = FleetCache(Settings(catalog=default_catalog()), None, lambda: dt.datetime.now(dt.UTC))
    # What a list of the Nodes leaves (FleetCache.rebuild), without a server.
    cache._document = document
    cache._keys = selection_keys(document, cache.settings.label_key)
    labels = {f"example.com/junk-{i}": "x" * 63 for i in range(5000)}
    labels.update({"pool": "vdi", "nvidia.com/vgpu.config": "a2"})
    cache.node_event("ADDED", {"metadata": {"name": "n1", "labels": labels}})
    assert cache._labels == {"n1": {"pool": "vdi", "nvidia.com/vgpu.config": "a2"}}
    # A change of a label no layout reads is no change of the node.
    labels["example.com/junk-1"] = "y"
    cache.node_event("MODIFIED", {"metadata": {"name": "n1", "labels": labels}})
    assert cache._marked == set()
