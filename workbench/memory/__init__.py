"""Memory and dreaming: a versioned memory store and dream sessions that propose memories."""

from .store import MemorySettings, MemoryStore

__all__ = ["MemorySettings", "MemoryStore"]
