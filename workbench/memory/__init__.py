"""Memory and dreaming: a versioned memory store and dream sessions that propose memories."""

from __future__ import annotations

from typing import Any

from .store import MemorySettings, MemoryStore

__all__ = ["MemorySettings", "MemoryStore", "attach"]


def attach(brain: Any, settings: MemorySettings | None = None) -> MemoryStore:
    """Give a brain the memory store of its log: new sessions get accepted memories, dreams get their tools."""
    from ..config import from_env
    from . import dream  # noqa: F401  (registers the dream tools and the scripted:dream model script)

    store = MemoryStore(brain.log, settings or from_env(MemorySettings, prefix="WORKBENCH_MEMORY_"))
    brain.extras["memory"] = store
    return store
