"""Tools: a name, a JSON schema and an async function.

Built-in tools register exactly like outside ones: a short name in TOOLS
(or the `workbench.tools` entry point group) mapping to a Tool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Awaitable, Callable

from ..errors import ConfigError
from ..hands import Hands, Observation


@dataclass
class ToolOutput:
    """What a tool returns: content blocks for the model, and details for the log."""

    content: list[dict[str, Any]]
    is_error: bool = False
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolContext:
    """What a running tool may use."""

    session_id: str
    hands: Callable[[], Hands]
    log: Any
    extras: dict[str, Any] = field(default_factory=dict)


ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]


@dataclass
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: ToolFn

    def spec(self) -> dict[str, Any]:
        """The tool as the Messages API expects it."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


def observation_output(obs: Observation) -> ToolOutput:
    """A hands Observation as a tool result."""
    return ToolOutput(content=obs.content_blocks(), is_error=not obs.ok, details={"observation": obs.to_json()})


async def run_python(inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    code = inp.get("code")
    if not isinstance(code, str):
        return ToolOutput([{"type": "text", "text": 'the python tool needs {"code": "<python source>"}'}], is_error=True)
    timeout = inp.get("timeout")
    if timeout is not None and not isinstance(timeout, (int, float)):
        return ToolOutput([{"type": "text", "text": "timeout must be a number of seconds"}], is_error=True)
    obs = await ctx.hands().execute(code, timeout=timeout)
    out = observation_output(obs)
    if inp.get("replayable"):
        out.details["replayable"] = True
    return out


PYTHON = Tool(
    name="python",
    description=(
        "Run Python code in a persistent Jupyter kernel (your hands) and return what it printed, "
        "returned, displayed (images included) or raised. Variables persist between calls unless "
        "the kernel dies; if it does, you are told, and the next call starts a fresh kernel. "
        "Output beyond a limit is truncated with a note: write big results to files."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python source to run"},
            "timeout": {"type": "number", "description": "seconds before the call is interrupted (capped)"},
            "replayable": {
                "type": "boolean",
                "description": "true for side-effect-free setup (imports, data loads) that may be re-run after a kernel death",
            },
        },
        "required": ["code"],
    },
    run=run_python,
)

TOOLS: dict[str, Tool] = {"python": PYTHON}


def register_tool(tool: Tool) -> Tool:
    """Make a tool available to sessions by name."""
    TOOLS[tool.name] = tool
    return tool


def get_tool(name: str) -> Tool:
    if name in TOOLS:
        return TOOLS[name]
    for ep in entry_points(group="workbench.tools"):
        if ep.name == name:
            return register_tool(ep.load())
    raise ConfigError(f"unknown tool {name!r}; known tools: {', '.join(sorted(TOOLS))}")
