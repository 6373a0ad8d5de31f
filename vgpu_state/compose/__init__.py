"""Composition: where the entry points (the commands, the agent, the device plugin)
get what they run on. ``compose.node`` opens a node."""

from vgpu_state.compose.node import NodeSettings, OpenNode, open_node

__all__ = ["NodeSettings", "OpenNode", "open_node"]
