"""Configuration: the settings schema, the layered loader and the live-reloading store."""

from qwenctxd.config.layers import Layer, build, deep_merge, strip_json_comments
from qwenctxd.config.loader import ConfigStore, Listener, ProjectListener
from qwenctxd.config.schema import DaemonSettings, ModelEndpoint, Settings
from qwenctxd.protocol.errors import ConfigError

__all__ = [
    "ConfigError",
    "ConfigStore",
    "DaemonSettings",
    "Layer",
    "Listener",
    "ModelEndpoint",
    "ProjectListener",
    "Settings",
    "build",
    "deep_merge",
    "strip_json_comments",
]
