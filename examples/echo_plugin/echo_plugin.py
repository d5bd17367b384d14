"""A third-party workbench plugin in one file: a tool and a model (the worked example of docs/plugins.md).

Install it next to the workbench (`pip install -e examples/echo_plugin`) and every host loads it:
sessions may use the `word_count` tool, and `--model echo` (or `echo:PREFIX`) is a model that
repeats the user's words.
"""

from __future__ import annotations

from typing import Any

from workbench.plugins import Plugin
from workbench.plugins.models import Reply, ScriptedModel, position
from workbench.plugins.tools import Tool, ToolContext, ToolOutput


async def word_count(inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    """Count the words of `text`: a tool that runs in the brain's process, not in the hands."""
    text = inp.get("text")
    if not isinstance(text, str):
        return ToolOutput([{"type": "text", "text": 'word_count needs {"text": "<some text>"}'}], is_error=True)
    return ToolOutput([{"type": "text", "text": str(len(text.split()))}])


WORD_COUNT = Tool(
    name="word_count",
    description="Count the words of a text.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    run=word_count,
)


def echo(prefix: str) -> ScriptedModel:
    """A model that answers with the user's last message, after `prefix`."""

    def script(request: dict[str, Any]) -> Reply:
        _, _, text = position(request)
        return Reply(text=f"{prefix or 'echo'}: {text}")

    return ScriptedModel(script, name=f"echo:{prefix}" if prefix else "echo")


class EchoPlugin(Plugin):
    """Adds the `word_count` tool and the `echo` model."""

    def __init__(self) -> None:
        super().__init__(name="echo")

    def tools(self) -> list[Tool]:
        return [WORD_COUNT]

    def models(self) -> dict[str, Any]:
        return {"echo": echo}
