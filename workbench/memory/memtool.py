"""`memory`: Anthropic's client-side memory tool (`memory_20250818`), served from the stores a session mounts.

The tool is declared as the API defines it (the SDK's `MemoryTool20250818Param`) with the beta header the
API took it with; its commands (memcommands.py, over the SDK's `BetaAbstractMemoryTool`) are imported at the
first call, since the SDK costs a host's start a second it does not need (tests/core/test_start.py).
docs/memory.md, "The memory tool".
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..plugins.tools import Tool, ToolContext, ToolOutput
from .store import MemoryStore

if TYPE_CHECKING:  # the SDK's type of the declaration: checked, never imported at run time
    from anthropic.types import MemoryTool20250818Param

MEMORY_BETA = "context-management-2025-06-27"  # the beta header the API took the memory tool with
DESCRIPTION = ("Anthropic's memory tool (memory_20250818) over the memory stores this session mounts: "
               "/memories/<store>/<file>, accepted memories as files; writes are versions attributed to the session, "
               "reviewed by people unless the store accepts them at once (docs/memory.md, 'The memory tool').")


def param() -> MemoryTool20250818Param:
    """The tool's declaration in a request, as the API defines it."""
    return {"type": "memory_20250818", "name": "memory"}


def memory_tool(store: MemoryStore) -> Tool:
    """`memory`: the memory tool, for any session that names it among its tools."""

    async def run(inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        from .memcommands import call

        return await asyncio.to_thread(call, store, inp, ctx)

    return Tool("memory", DESCRIPTION, {"type": "object"}, run, param=param(), betas=(MEMORY_BETA,))
