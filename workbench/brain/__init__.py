"""The brain: model + harness loop, stateless between steps."""

from .loop import DEFAULT_SYSTEM, Brain, BrainSettings, default_hands_factory
from .request import build_request, turn_state
from .tools import TOOLS, Tool, ToolContext, ToolOutput, get_tool, register_tool

__all__ = [
    "Brain", "BrainSettings", "DEFAULT_SYSTEM", "TOOLS", "Tool", "ToolContext", "ToolOutput",
    "build_request", "default_hands_factory", "get_tool", "register_tool", "turn_state",
]
