"""The kubelet device plugin: one gRPC ``DevicePlugin`` server per vGPU resource.

Importing this package loads grpc; commands that do not serve the plugin never do.
"""

from vgpu_state.deviceplugin.manager import DEFAULT_PLUGIN_DIR, DevicePluginManager, ResourceStatus

__all__ = ["DEFAULT_PLUGIN_DIR", "DevicePluginManager", "ResourceStatus"]
