"""Memory and dreaming: a versioned memory store and dream sessions that propose memories.

It joins a host as a plugin (`workbench.memory.plugin.MemoryPlugin`), built in.
"""

from .store import MemorySettings, MemoryStore

__all__ = ["MemorySettings", "MemoryStore"]
