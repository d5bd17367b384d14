"""Tools a plugin gives sessions: what a tool is, what a call gets, what it returns (docs/plugins.md)."""

from __future__ import annotations

from ..brain.tools import Tool, ToolContext, ToolOutput

__all__ = ["Tool", "ToolContext", "ToolOutput"]
