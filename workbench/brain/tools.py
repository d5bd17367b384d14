"""Tools: a name, a JSON schema and an async function.

The brain gets its tools by name from its host (`python`, plus what plugins
contribute; see workbench.plugins). A tool reaches what it needs through its
ToolContext, or through the plugin that made it (its function can close over
the plugin's state): there is no global registry.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError
from ..hands import Hands, Observation
from ..log import SessionLog


@dataclass
class ToolOutput:
    """What a tool returns: content blocks for the model, and details for the log.

    The `python` tool's content is None: the model reads its observation (`details["observation"]`), rendered
    again whenever the request is built, so the log keeps a call's outputs once (docs/events.md, `tool_result`)."""

    content: list[dict[str, Any]] | None
    is_error: bool = False
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolContext:
    """What a running tool may use: its session, that session's hands (made on first use), the log, its call's id,
    and where to send output while it runs (`output(kind, text)`: live, never stored; brain/live.py)."""

    session_id: str
    hands: Callable[[], Awaitable[Hands]]
    log: SessionLog
    tool_use_id: str = ""
    output: Callable[[str, str], None] | None = None


ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]


@dataclass
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: ToolFn
    # safe to run at the same time as other calls of the same turn (the brain then runs a run of
    # such calls concurrently, and still records their results in the order the model made them)
    concurrent: bool = False
    # how to finish a call whose start is logged but whose result is not (the process running the
    # turn died): None means it is answered "interrupted; state unknown" and never re-run; a tool
    # whose work outlives the process (e.g. child sessions) may instead re-attach to it
    resume: ToolFn | None = None
    # a tool the API defines and models are trained on (Anthropic's memory tool: {"type": "memory_20250818",
    # "name": "memory"}): the request declares it by this param alone, its schema is the API's
    param: Mapping[str, Any] | None = None
    # the beta headers the API wants for this tool; frozen with a session that has it, sent with every request
    betas: tuple[str, ...] = ()

    def spec(self) -> dict[str, Any]:
        """The tool as the Messages API expects it (plain JSON: a schema may be built from read-only mappings)."""
        if self.param is not None:
            return dict(_plain(self.param))
        return {"name": self.name, "description": self.description, "input_schema": _plain(self.input_schema)}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def observation_output(obs: Observation) -> ToolOutput:
    """A hands Observation as a tool result: the observation alone, which the model's content is rendered from."""
    return ToolOutput(content=None, is_error=not obs.ok, details={"observation": obs.to_json()})


async def run_python(inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    code = inp.get("code")
    if not isinstance(code, str):
        return ToolOutput([{"type": "text", "text": 'the python tool needs {"code": "<python source>"}'}], is_error=True)
    timeout = inp.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        return ToolOutput([{"type": "text", "text": "timeout must be a positive number of seconds"}], is_error=True)
    hands = await ctx.hands()
    obs = await hands.execute(code, timeout=timeout, on_output=ctx.output)
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

BUILTIN_TOOLS: Mapping[str, Tool] = MappingProxyType({"python": PYTHON})


def tool_named(tools: Mapping[str, Tool], name: Any) -> Tool:
    """The tool called `name`; ConfigError naming the known ones."""
    if isinstance(name, str) and name in tools:
        return tools[name]
    shown = repr(name)[:80]
    raise ConfigError(f"unknown tool {shown}; known tools: {', '.join(sorted(tools))}")
