"""Delegation as a plugin: the `delegate` tool, its settings and the `scripted:delegate` script."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..plugins import Plugin
from ..plugins.errors import WorkbenchError
from ..plugins.hands import FileRefused, read_files
from ..plugins.settings import from_env
from ..plugins.tools import Tool, ToolContext, ToolOutput
from .run import Delegation, child_id, depth_of
from .script import delegate_script, worker_script
from .spec import BadInput, parse

if TYPE_CHECKING:
    from ..plugins import PluginHost as Host


@dataclass
class DelegateSettings:
    """Delegation to child sessions (env: WORKBENCH_DELEGATE_<FIELD>); documented in docs/settings.md."""

    max_children: int = 16  # children one delegate call may start
    max_running: int = 32  # delegated children running at once in one host; a call that would pass it is refused
    max_depth: int = 2  # how deep delegation nests: a session at this depth may not delegate
    default_turns: int = 20  # model responses a child may make, when the call does not say
    max_turns: int = 200  # the most a call may give a child
    default_tokens: int = 500_000  # tokens (input + output) a child may use, when the call does not say
    max_tokens: int = 5_000_000  # the most a call may give a child
    default_timeout: float = 900.0  # seconds a child may run, when the call does not say
    max_timeout: float = 7200.0  # the most a call may give a child
    max_rounds: int = 10  # turns a child with a check may be given (outcome mode: a failed verdict is its next message)
    max_files: int = 100  # files one child may be passed
    max_file_mb: float = 16.0  # bytes of the files passed to one child, in all
    max_answer_chars: int = 20_000  # of each child's final answer in the tool result (the rest stays in its log)


DESCRIPTION = (
    "Delegate tasks to child agents. Each task starts a new session with its own hands (a fresh kernel and "
    "workspace), its own model and limits; the children of one call (and of several delegate calls in one "
    "response) run in parallel, and the tool returns when all have finished, with each child's final answer. "
    "A child sees only its prompt and the files you pass (relative paths in your workspace, copied into its "
    "own), so write self-contained prompts. A child that fails, crashes or runs out of its limits is reported, "
    "not retried."
)

SCHEMA: Mapping[str, Any] = MappingProxyType({
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "minItems": 1,
            "description": "one object per child",
            "items": {
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "description": "the child's task, self-contained"},
                    "title": {"type": "string", "description": "a short name for the child's session"},
                    "model": {"type": "string", "description": "the child's model (default: yours)"},
                    "tools": {"type": "array", "items": {"type": "string"}, "description": "its tools (default: [\"python\"])"},
                    "files": {"type": "array", "items": {"type": "string"},
                              "description": "relative paths in your workspace, copied into the child's"},
                    "max_turns": {"type": "integer", "description": "model responses it may make"},
                    "max_tokens": {"type": "integer", "description": "tokens (input + output) it may use"},
                    "timeout": {"type": "number", "description": "seconds it may run"},
                    "check": {"anyOf": [
                        {"type": "string", "description": "Python run after the child ends, in fresh hands, on a copy "
                                                          "of its workspace: it passes unless it raises (e.g. an assert)"},
                        {"type": "object", "properties": {"python": {"type": "string"}}, "required": ["python"]},
                        {"type": "object", "description": "a model grades the child's answer and files against the rubric",
                         "properties": {"rubric": {"type": "string"},
                                        "model": {"type": "string", "description": "the grading model (default: the child's)"}},
                         "required": ["rubric"]}]},
                    "rounds": {"type": "integer",
                               "description": "turns the child may take (default 1): while its check fails, the verdict "
                                              "is sent to it as its next message"},
                },
                "required": ["prompt"],
            },
        },
    },
    "required": ["tasks"],
})


def _error(text: str) -> ToolOutput:
    return ToolOutput([{"type": "text", "text": text}], is_error=True)


@dataclass
class DelegatePlugin(Plugin):
    """The `delegate` tool: child sessions, run in parallel, linked to their parent in the log."""

    name: str = "delegate"
    settings: DelegateSettings = field(default_factory=lambda: from_env(DelegateSettings, prefix="WORKBENCH_DELEGATE_"))
    running: set[str] = field(default_factory=set, repr=False)  # children running now in this host, or reserved to start

    def settings_classes(self) -> Sequence[type]:
        return (DelegateSettings,)

    def tools(self) -> Sequence[Tool]:
        return [Tool("delegate", DESCRIPTION, dict(SCHEMA), self.run, concurrent=True, resume=self.resume)]

    def scripts(self) -> Mapping[str, Any]:
        return {"delegate": delegate_script, "worker": worker_script}

    async def run(self, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """A new delegate call: check it, then start its children and wait for them."""
        return await self._delegate(inp, ctx, resuming=False)

    async def resume(self, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """A call cut off by a dead process: re-attach to the children it started, start those it had not."""
        return await self._delegate(inp, ctx, resuming=True)

    async def _delegate(self, inp: dict[str, Any], ctx: ToolContext, resuming: bool) -> ToolOutput:
        host = self._host()
        s = self.settings
        events = await host.brain.events(ctx.session_id)
        created = events[0] if events else None
        depth = depth_of(created)
        if depth >= s.max_depth:
            return _error(f"delegation is nested {depth} deep here, the most this workbench allows "
                          f"(WORKBENCH_DELEGATE_MAX_DEPTH={s.max_depth}); do the task yourself")
        parent_model = str((created.payload if created else {}).get("model") or host.models.default_name())
        try:
            specs = parse(inp, parent_model=parent_model, settings=s, known_tools=set(host.tools))
            graders = (sp.check.model for sp in specs if sp.check is not None and sp.check.model)
            for model in dict.fromkeys([*(sp.model for sp in specs), *graders]):
                await asyncio.to_thread(host.models.check, model)
        except BadInput as e:
            return _error(str(e))
        except WorkbenchError as e:
            return _error(f"cannot delegate: {e}")
        if not resuming and len(self.running) + len(specs) > s.max_running:
            return _error(f"{len(self.running)} delegated sessions are running in this workbench and at most "
                          f"{s.max_running} may; delegate fewer at once (or wait)")
        # reserved with no await since the check: concurrent calls each see the others' children
        ids = [child_id(ctx.session_id, ctx.tool_use_id, i) for i in range(len(specs))]
        self.running.update(ids)
        try:
            try:
                files = await self._files(specs, ctx)
            except FileRefused as e:
                if not resuming:
                    return _error(str(e))
                files = {}  # children that started have theirs; one that had not is told the files are gone

            return await Delegation(host, ctx.session_id, ctx.tool_use_id, specs, depth, files,
                                    s.max_answer_chars, int(s.max_file_mb * 1024 * 1024)).run()
        finally:
            self.running.difference_update(ids)

    async def _files(self, specs: list[Any], ctx: ToolContext) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(p for sp in specs for p in sp.files))
        if not wanted:
            return {}
        hands = await ctx.hands()
        root = await hands.workspace()
        limit = int(self.settings.max_file_mb * 1024 * 1024)
        files = await asyncio.to_thread(read_files, root, wanted, limit * len(specs))
        for sp in specs:
            total = sum(len(files[p]) for p in sp.files)
            if total > limit:
                raise FileRefused(f"the files for one child hold {total} bytes; at most {limit} "
                                  "(WORKBENCH_DELEGATE_MAX_FILE_MB)")
        return files

    def _host(self) -> Host:
        assert self.host is not None, "the host attaches its plugins before the brain runs their tools"
        return self.host
