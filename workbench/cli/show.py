"""`workbench show`: a session as a readable transcript (what was said, the code that ran and what it printed).

`--events` prints every event on a line of its own instead, as the log has them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..render import assistant_meta, event_text, one_line, result_text, safe_text, tool_input
from ..usage import describe
from .console import EXIT_OK

RESULT_LINES = 40  # a tool result's lines shown at most (the rest is counted)
NOTES = MappingProxyType({  # events shown as a one-line note, and how
    "interrupted": lambda p: f"interrupted by {p.get('by') or 'a person'}",
    "resumed": lambda p: "the turn was resumed from the log",
    "model_error": lambda p: f"the model call failed: {p.get('error') or p.get('message') or ''}",
    "turn_failed": lambda p: f"the harness failed: {p.get('error') or ''}",
    "hands_started": lambda p: f"hands started (generation {p.get('generation')})",
    "hands_died": lambda p: "the kernel died; its in-memory state is gone",
    "hands_restarted": lambda p: "the hands were restarted",
    "hands_timeout": lambda p: "a call ran past its timeout",
    "hands_refused": lambda p: "code was not run: no safe sandbox",
    "session_renamed": lambda p: f"renamed to {p.get('title')!r}",
    "session_archived": lambda p: "archived" if p.get("archived") else "unarchived",
    "memories_injected": lambda p: f"{len(p.get('memories') or [])} memories recalled",
})


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines()) if text else ""


def _clip(text: str, lines: int = RESULT_LINES) -> str:
    rows = text.splitlines()
    if len(rows) <= lines:
        return text
    return "\n".join(rows[:lines] + [f"… ({len(rows) - lines} more lines: `workbench export` has all)"])


def transcript(events: list[Any], row: Mapping[str, Any] | None = None, usage: Mapping[str, Any] | None = None) -> str:
    """A session's events as a transcript a person reads top to bottom."""
    out: list[str] = []
    if row is not None:
        title = one_line(safe_text(row.get("title") or "(untitled)"), 200)
        out.append(f"session {row['id']}: {title}")
        out.append(f"model {row.get('model')}, created {str(row.get('created_at'))[:19]} UTC, {row.get('events')} events")
    for e in events:
        p = e.payload
        when = e.ts.strftime("%H:%M:%S")
        if e.type == "session_created" and isinstance(p.get("forked_from"), Mapping):
            f = p["forked_from"]
            out.append(f"  · forked from session {f.get('session_id')} at event {f.get('seq')}")
        elif e.type == "user_message":
            out += ["", f"── you  #{e.seq}  {when}", _indent(safe_text(event_text(e)))]
        elif e.type == "assistant_turn":
            message = p.get("message") if isinstance(p.get("message"), Mapping) else {}
            out += ["", f"── agent  #{e.seq}  {when}"]
            for b in message.get("content") or []:
                if not isinstance(b, Mapping):
                    continue
                if b.get("type") == "text" and b.get("text"):
                    out.append(_indent(safe_text(str(b["text"]))))
                elif b.get("type") == "tool_use":
                    out.append(f"  ▸ {b.get('name')}")
                    out.append(_indent(safe_text(tool_input(b.get("name"), b.get("input"))), "      "))
        elif e.type == "tool_result":
            text = safe_text(result_text(p)) or "(no output)"
            out.append(f"  ◂ {'error' if p.get('is_error') else 'output'}")
            out.append(_indent(_clip(text), "      "))
        elif e.type == "turn_ended":
            out.append(f"  · turn ended ({p.get('stop_reason')})")
        elif e.type in NOTES:
            out.append(f"  · {one_line(safe_text(str(NOTES[e.type](p))), 300)}")
    if usage is not None and usage["total"]["calls"]:
        out += ["", f"usage: {describe(usage['total'], usage['priced'])}"]
    return "\n".join(out)


def print_events(events: list[Any]) -> int:
    """Every event on a line of its own (`show --events`)."""
    for e in events:
        head = f"{e.seq:>5} {e.ts.strftime('%H:%M:%S')} {e.type:<16}"
        if e.type == "assistant_turn":
            print(f"{head} {assistant_meta(e.payload)}")
            body = event_text(e, thinking=True)
            if body:
                print("        " + safe_text(body).replace("\n", "\n        "))
        elif e.type in ("user_message", "tool_result"):
            print(f"{head} " + safe_text(event_text(e)[:2000]).replace("\n", "\n        "))
        else:
            print(f"{head} {safe_text(event_text(e)[:300])}")
    return EXIT_OK


def print_show(args: Any, events: list[Any], row: Mapping[str, Any] | None, usage: Mapping[str, Any] | None) -> int:
    if getattr(args, "events", False):
        return print_events(events)
    sys.stdout.write(transcript(events, row, usage) + "\n")
    return EXIT_OK
