"""The brain: model + harness loop, stateless between steps."""

from .brain import Brain, BrainSettings
from .calls import replayable_calls
from .request import build_request, turn_state
from .sessions import DEFAULT_SYSTEM, NewSession, PromptPart
from .tools import BUILTIN_TOOLS, Tool, ToolContext, ToolOutput, tool_named

__all__ = [
    "BUILTIN_TOOLS", "Brain", "BrainSettings", "DEFAULT_SYSTEM", "NewSession", "PromptPart", "Tool", "ToolContext",
    "ToolOutput", "build_request", "replayable_calls", "tool_named", "turn_state",
]
