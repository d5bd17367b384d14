"""Delegation: a `delegate` tool with which a session starts child sessions and waits for them, in parallel."""

from .plugin import DelegatePlugin, DelegateSettings

__all__ = ["DelegatePlugin", "DelegateSettings"]
