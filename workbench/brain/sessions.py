"""A new session's frozen prefix: system prompt, tools and model settings, and what plugins add to it.

The prefix is written once, in `session_created`, and never changes: every
request of the session starts with it. Plugins contribute through prompt
hooks (e.g. accepted memories); what they add and the events that record it
are written in the same transaction as the session.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .tools import Tool

DEFAULT_SYSTEM = (
    "You are an agent working in a Jupyter workbench. You run Python with the `python` tool in a "
    "persistent kernel of your own (your hands), separate from the user's notebook. Think briefly, "
    "run code to check facts rather than guessing, and report results plainly."
)


@dataclass(frozen=True)
class NewSession:
    """What a system-prompt contribution may look at: the session being created."""

    kind: str
    title: str | None
    model: str
    config: Mapping[str, Any]
    message: str | None = None  # the first user message, when the creator knows it (memories are ranked by it)


@dataclass(frozen=True)
class PromptPart:
    """Text for a new session's frozen system prompt, and events recorded with the session, atomically."""

    text: str
    events: tuple[tuple[str, dict[str, Any]], ...] = ()


PromptHook = Callable[[NewSession], "PromptPart | None"]


def session_payload(session_id: str | None, *, title: str | None, model: str, system: str | None,
                    tools: Sequence[Tool], config: dict[str, Any] | None, kind: str, settings: Any,
                    hooks: Sequence[PromptHook] = (), parent_id: str | None = None,
                    origin: dict[str, Any] | None = None,
                    message: str | None = None) -> tuple[str, dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """(session id, the `session_created` payload, the events to write with it).

    A session another session started (a delegated child) names it in `parent_id`, and what
    started it (e.g. the tool call) in `origin`."""
    session_id = session_id or uuid.uuid4().hex[:12]
    config = dict(config or {})
    parts = [p for p in (hook(NewSession(kind, title, model, config, message)) for hook in hooks) if p is not None and p.text]
    prompt = (system or DEFAULT_SYSTEM) + "".join(f"\n\n{p.text}" for p in parts)
    thinking = config.get("thinking", settings.thinking)
    effort = config.get("effort", settings.effort)
    mode = config.get("context", settings.context)
    if mode not in ("compact", "clear", "off", "turn"):
        raise ConfigError(f"context must be compact, clear, off or turn, not {str(mode)[:40]!r}")
    trigger = config.get("context_trigger", settings.context_trigger)
    if isinstance(trigger, bool) or not isinstance(trigger, int) or trigger < 1000:
        raise ConfigError(f"context_trigger must be a whole number of tokens >= 1000, not {str(trigger)[:40]!r}")
    payload: dict[str, Any] = {
        "title": title,
        "model": model,
        "system": prompt,
        "tools": [t.spec() for t in tools],
        "max_tokens": int(config.get("max_tokens", settings.max_tokens)),
        "thinking": {"type": thinking} if thinking != "disabled" else None,
        "output_config": {"effort": effort} if effort else None,
        "context": {"mode": mode, "trigger": trigger} if mode != "off" else None,
        "config": config,
    }
    betas = sorted({b for t in tools for b in t.betas})
    if betas:  # a tool of the API's that wants a beta header (the memory tool)
        payload["betas"] = betas
    if parent_id is not None:
        payload["parent_id"] = parent_id
        payload["origin"] = dict(origin or {})
    return session_id, payload, [e for p in parts for e in p.events]
