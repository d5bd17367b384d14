"""Reading other sessions' events the way a dream sees them, and checking citations.

A citation names a session, an event seq and a quote; it holds only when the
quote appears in that event. Events that carry recalled memories (the system
prompt, `memories_injected`) or the dreaming machinery itself cannot be cited,
so a memory is never re-extracted from its own recall.
"""

from __future__ import annotations

import re
from typing import Any

from ..plugins.log import Event, SessionLog
from ..plugins.text import event_text as said, result_text

UNCITABLE = frozenset({"session_created", "memories_injected", "dream_read", "memory_proposed", "model_request", "model_retry"})
RECALL = "recall"  # the tool whose results are recalled memories: not evidence either
MEMORY_TOOL = "memory"  # the memory tool's calls read and write memories: they are memory, not evidence
MIN_QUOTE = 8
BODY_LIMIT = 2000


def normalize(s: str) -> str:
    """Whitespace collapsed and case folded, for comparing quotes with event text."""
    return re.sub(r"\s+", " ", s).strip().casefold()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() if k not in ("signature", "data") for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def event_text(e: Event) -> str:
    """Every string in the event's payload (no system prompt, no signatures): what a quote is checked against."""
    payload = {k: v for k, v in e.payload.items() if k != "system"} if e.type == "session_created" else e.payload
    strings = _strings(payload)
    if e.type == "tool_result":  # what the model (and a dream) read of it: a python call's is rendered from its outputs
        strings.append(result_text(e.payload))
    return "\n".join(strings)


def render_event(e: Event) -> str:
    """One event as a dream reads it: `#seq type`, then an indented body (workbench.render says what it says)."""
    p = e.payload
    head = f"#{e.seq} {e.type}"
    if e.type == "tool_started":
        head += f" {p.get('name')}"
    elif e.type == "tool_result":
        head += f" {p.get('name')}" + (" [error]" if p.get("is_error") else "")
    if e.type == "tool_result" and p.get("name") == RECALL and not p.get("is_error"):
        body = "(recalled memories, not evidence: " + ", ".join(str(m.get("id")) for m in p.get("recalled") or []) + ")"
    elif e.type == "tool_result":
        body = result_text(p)  # the head says [error]
    elif e.type == "session_created":
        body = f"title: {p.get('title')}\nmodel: {p.get('model')}\n(system prompt not shown: it may hold recalled memories)"
    elif e.type == "memories_injected":
        body = "(recalled memories, not evidence: " + ", ".join(m["id"] for m in p.get("memories", [])) + ")"
    else:
        body = said(e)
    if len(body) > BODY_LIMIT:
        body = body[:BODY_LIMIT] + f"\n[... {len(body) - BODY_LIMIT} more characters; search for a phrase to see the rest]"
    return head + "\n" + "\n".join("  " + line for line in body.splitlines())


def check_citations(log: SessionLog, items: Any, *, scope: list[str] | None, required: bool) -> list[str]:
    """Problems with a provenance list, each a line the dreaming model can act on (empty: all good)."""
    if items is None or items == []:
        return ["provenance is required: a list of {session_id, seq, quote} where quote is copied from that event"] if required else []
    if not isinstance(items, list):
        return ["provenance must be a list of {session_id, seq, quote} objects"]
    problems = []
    for i, c in enumerate(items):
        where = f"provenance[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("session_id"), str) or not isinstance(c.get("seq"), int):
            problems.append(f"{where}: needs session_id (string), seq (integer) and quote (string)")
            continue
        sid, seq, quote = c["session_id"], c["seq"], c.get("quote")
        if not log.has_session(sid):
            problems.append(f"{where}: there is no session {sid!r}; list_sessions shows the ids")
            continue
        s = log.session(sid)
        if s["kind"] == "dream":
            problems.append(f"{where}: session {sid} is a dream; cite the sessions it read, not a dream")
            continue
        if scope is not None and sid not in scope:
            problems.append(f"{where}: session {sid} is not one of this dream's sessions ({', '.join(scope)})")
            continue
        found = log.events(sid, after=seq - 1, until=seq)
        if not found:
            problems.append(f"{where}: session {sid} has no event {seq} (its events are 1..{s['last_seq']}); read_events shows them")
            continue
        e = found[0]
        if e.type in UNCITABLE or (e.type == "tool_result" and e.payload.get("name") == RECALL) \
                or (e.type in ("tool_started", "tool_result") and e.payload.get("name") == MEMORY_TOOL):
            problems.append(f"{where}: event {sid} #{seq} is a {e.type} event, which is not evidence; "
                            "cite what happened in the session (messages, tool calls, results)")
            continue
        if not isinstance(quote, str) or len(normalize(quote)) < MIN_QUOTE:
            problems.append(f"{where}: quote must be at least {MIN_QUOTE} characters copied exactly from event {sid} #{seq}")
            continue
        if normalize(quote) not in normalize(event_text(e)):
            problems.append(f"{where}: the quote {quote[:80]!r} does not appear in event {sid} #{seq} ({e.type}); "
                            "copy it exactly from read_events output")
    return problems
