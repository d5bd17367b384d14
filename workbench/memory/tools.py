"""The tools a dream session has: read other sessions and memories, propose changes.

Proposals are staged in the dream's own log (the tool result's details) and
committed by `commit_dream` together with the dream's read positions, in one
transaction: a dream that dies half-way leaves nothing behind, and a dream
that finished is never redone. `dream_tools(store)` makes them for one store;
each runs in a worker thread, since it reads the log and the store with
blocking DuckDB calls that must stay off the server's event loop.
"""

from __future__ import annotations

import asyncio
import difflib
import uuid
from collections.abc import Callable
from datetime import datetime
from types import MappingProxyType
from typing import Any

from ..brain.tools import Tool, ToolContext, ToolOutput
from ..errors import WorkbenchError
from ..log import Event
from .events import check_citations, normalize, render_event
from .store import MemoryStore, field_problems

MAX_EVENTS = 200
DUPLICATE_RATIO = 0.85


def _out(text: str, error: bool = False, **details: Any) -> ToolOutput:
    return ToolOutput([{"type": "text", "text": text}], is_error=error, details=details)


def dream_scope(ctx: ToolContext) -> list[str] | None:
    """The session ids this dream was asked to read (None: every non-dream session)."""
    return ((ctx.log.events(ctx.session_id, until=1)[0].payload.get("config") or {}).get("dream") or {}).get("sessions")


def staged(events: list[Event]) -> list[dict[str, Any]]:
    """The proposals a dream's tools accepted so far, read from its log."""
    return [e.payload["proposal"] for e in events
            if e.type == "tool_result" and not e.payload.get("is_error") and "proposal" in e.payload]


def list_sessions(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    scope = dream_scope(ctx)
    marks = store.bookmarks()
    rows = [s for s in ctx.log.sessions(ids=scope, kind="chat")]
    since, until, title, tag = inp.get("since"), inp.get("until"), inp.get("title"), inp.get("tag")
    if any(v is not None and not isinstance(v, str) for v in (since, until, title, tag)):
        return _out("since, until, title and tag must be strings", True)
    try:
        if since:
            rows = [s for s in rows if s["updated_at"] >= datetime.fromisoformat(since).isoformat()]
        if until:
            rows = [s for s in rows if s["created_at"] <= datetime.fromisoformat(until).isoformat()]
    except ValueError:
        return _out("since and until must be ISO dates, e.g. 2026-11-30 or 2026-11-30T10:00", True)
    if title:
        rows = [s for s in rows if normalize(title) in normalize(s["title"] or "")]
    if tag:
        def tags(s: dict) -> list[str]:
            return ((ctx.log.events(s["id"], until=1)[0].payload.get("config") or {}).get("tags")) or []
        rows = [s for s in rows if tag in tags(s)]
    if not rows:
        return _out("no sessions match")
    lines = []
    limit = inp.get("limit") or 100
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return _out("limit must be a positive integer", True)
    for s in rows[:limit]:
        read = marks.get(s["id"], 0)
        lines.append(f"{s['id']}  created={s['created_at'][:19]}  events={s['last_seq']}  read_until={read}  "
                     f"unread={max(0, s['last_seq'] - read)}  title={' '.join((s['title'] or '').split())}")
    return _out("\n".join(lines))


def read_events(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    sid = inp.get("session_id")
    scope = dream_scope(ctx)
    if not isinstance(sid, str) or not ctx.log.has_session(sid) or (scope is not None and sid not in scope):
        return _out(f"no session {sid!r} in this dream; list_sessions shows the ids", True)
    marks = store.bookmarks()
    after = inp.get("after", marks.get(sid, 0))
    until, search = inp.get("until"), inp.get("search")
    limit = inp.get("limit") or 50
    bad = [k for k, v in (("after", after), ("until", until), ("limit", limit))
           if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**62)]
    if bad or (search is not None and not isinstance(search, str)):
        return _out(f"{', '.join(bad) or 'search'}: after, until and limit must be non-negative integers, search a string", True)
    limit = min(max(limit, 1), MAX_EVENTS)
    events = ctx.log.events(sid, after=after, until=until)
    if search:
        events = [e for e in events if normalize(search) in normalize(render_event(e))]
    shown = events[:limit]
    last = ctx.log.session(sid)["last_seq"]
    if not shown:
        return _out(f"session {sid}: no events after #{after}{' matching ' + repr(search) if search else ''} (last seq {last})")
    title = " ".join((ctx.log.session(sid)["title"] or "").split())
    head = f"== session {sid} \"{title}\": events #{shown[0].seq}..#{shown[-1].seq} of {last} =="
    more = f"\n(more: call again with after={shown[-1].seq})" if len(events) > len(shown) else ""
    # only an unfiltered slice counts as read; a search skips events between its hits
    details: dict[str, Any] = {} if search else {"read": {"session_id": sid, "after": after, "until": shown[-1].seq}}
    return _out(head + "\n" + "\n".join(render_event(e) for e in shown) + more, **details)


def read_memories(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    if any(inp.get(k) is not None and not isinstance(inp.get(k), str) for k in ("status", "tag", "search")):
        return _out("status, tag and search must be strings", True)
    rows = store.list(status=inp.get("status"), tag=inp.get("tag"), search=inp.get("search"))
    if not rows:
        return _out("no memories match")
    return _out("\n\n".join(f"[{m['id']}] ({m['status']}) {m['title']}\n  tags: {', '.join(m['tags'])}\n  "
                            + m["text"].replace("\n", "\n  ") for m in rows))


def _duplicate(store: MemoryStore, pending: list[dict[str, Any]], title: str, text: str, skip: set[str]) -> str | None:
    """Why this looks like a memory that exists or is staged, or None."""
    candidates = [(m["id"], m["status"], m["title"], m["text"]) for m in store.list() if m["id"] not in skip]
    candidates += [(p["memory_id"], "staged in this dream", p["title"], p["text"]) for p in pending]
    for mid, status, t, x in candidates:
        if normalize(t) == normalize(title) or difflib.SequenceMatcher(None, normalize(x), normalize(text)).ratio() >= DUPLICATE_RATIO:
            return (f"memory {mid} ({status}) already says this: {t!r}. Do not propose it again; "
                    f"if it needs changing, use propose_edit with memory_id {mid}")
    return None


def _propose(kind: str, store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    scope = dream_scope(ctx)
    pending = staged(ctx.log.events(ctx.session_id))
    named = inp.get("memory_ids") if kind == "merge" else ([inp.get("memory_id")] if kind != "create" else [])
    targets: list[Any] = named if isinstance(named, list) else []  # model input: any JSON, checked one by one
    problems = []
    current: dict[str, dict[str, Any]] = {}
    for t in targets:
        m = None
        if isinstance(t, str):
            try:
                m = store.get(t)
            except Exception:
                m = None
        if m is None:
            problems.append(f"there is no memory {t!r}; read_memories shows the ids")
            continue
        current[t] = m
        if m["status"] not in ("accepted", "proposed"):
            problems.append(f"memory {t} is {m['status']}; only accepted or proposed memories can change")
    if kind == "merge" and len(targets) < 2:
        problems.append("memory_ids must list at least two memories to merge")
    title, text = inp.get("title"), inp.get("text")
    if kind == "retire":
        retired = current.get(targets[0]) if isinstance(targets[0], str) else None
        title = title or (retired or {}).get("title", "retire")
        text = inp.get("reason")
        if not isinstance(title, str):
            problems.append("title must be a string")
        if not isinstance(text, str) or not text.strip():
            problems.append("reason is required: why this memory is wrong or out of date")
    elif not (isinstance(title, str) and title.strip() and isinstance(text, str) and text.strip()):
        problems.append("title and text are required (non-empty strings)")
    else:
        problems += field_problems(title, text, inp.get("tags"))
    provenance = inp.get("provenance")
    problems += check_citations(ctx.log, provenance, scope=scope, required=kind in ("create", "edit"))
    if not problems and kind == "create":
        assert isinstance(title, str) and isinstance(text, str), "checked above"
        dup = _duplicate(store, pending, title, text, skip=set())
        if dup:
            problems.append(dup)
        marks = store.bookmarks()
        if all(c["seq"] <= marks.get(c["session_id"], 0) for c in provenance or []):
            problems.append("every cited event was read by an earlier dream, whose proposals were already made; "
                            "propose memories only from events after read_until (list_sessions shows it)")
    if problems:
        return _out("not proposed:\n" + "\n".join(f"- {p}" for p in problems), True)
    assert isinstance(title, str) and isinstance(text, str), "checked above"
    provenance = [{"session_id": c["session_id"], "seq": c["seq"], "quote": c["quote"]} for c in provenance or []]
    if kind == "merge":
        provenance = [c for t in targets for c in current[t]["provenance"]] + provenance
    proposal = {
        "memory_id": "m" + uuid.uuid4().hex[:10], "proposal": kind, "title": title.strip(), "text": text.strip(),
        "tags": inp.get("tags") or [], "provenance": provenance, "targets": list(targets), "note": inp.get("reason"),
    }
    what = {"create": "new memory", "edit": f"edit of {targets[0] if targets else ''}",
            "merge": f"merge of {', '.join(targets)}", "retire": f"retirement of {targets[0] if targets else ''}"}[kind]
    return _out(f"staged {proposal['memory_id']} ({what}): it is proposed for review when this dream ends", proposal=proposal)


def propose_memory(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    return _propose("create", store, inp, ctx)


def propose_edit(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    return _propose("edit", store, inp, ctx)


def propose_merge(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    return _propose("merge", store, inp, ctx)


def propose_retire(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    return _propose("retire", store, inp, ctx)


CITATIONS = MappingProxyType({
    "type": "array",
    "description": "the evidence: events that show this, each with a quote copied exactly from the event",
    "items": {
        "type": "object",
        "properties": {"session_id": {"type": "string"}, "seq": {"type": "integer"},
                       "quote": {"type": "string", "description": "at least 8 characters copied from that event"}},
        "required": ["session_id", "seq", "quote"],
    },
})
TAGS = MappingProxyType({"type": "array", "items": {"type": "string"}})

SPECS: tuple[tuple[str, str, dict[str, Any], Callable[..., ToolOutput]], ...] = (
    ("list_sessions", "List the sessions this dream may read, with how far earlier dreams read each (read_until) "
                      "and how many events are unread.",
         {"type": "object", "properties": {"since": {"type": "string", "description": "ISO date: only sessions active since"},
                                           "until": {"type": "string", "description": "ISO date: only sessions created before"},
                                           "title": {"type": "string", "description": "text the title contains"},
                                           "tag": {"type": "string", "description": "a tag in the session's config.tags"},
                                           "limit": {"type": "integer"}}}, list_sessions),
    ("read_events", "Read a session's events in seq order: by default the ones no dream has read yet. "
                    "Use after/until for a slice, search for text.",
         {"type": "object", "properties": {"session_id": {"type": "string"}, "after": {"type": "integer"}, "until": {"type": "integer"},
                                           "search": {"type": "string"},
                                           "limit": {"type": "integer", "description": f"at most {MAX_EVENTS}"}},
          "required": ["session_id"]}, read_events),
    ("read_memories", "Read the current memories (all statuses unless filtered). Never propose one of these again as new.",
         {"type": "object", "properties": {"status": {"type": "string"}, "tag": {"type": "string"}, "search": {"type": "string"}}},
         read_memories),
    ("propose_memory", "Propose a new memory: a durable, checked fact worth knowing in future sessions "
                       "(not a guess, not a dead end). A person reviews it.",
         {"type": "object", "properties": {"title": {"type": "string"}, "text": {"type": "string"}, "tags": TAGS, "provenance": CITATIONS},
          "required": ["title", "text", "provenance"]}, propose_memory),
    ("propose_edit", "Propose a new version of an existing memory (it replaces the old one when accepted).",
         {"type": "object", "properties": {"memory_id": {"type": "string"}, "title": {"type": "string"}, "text": {"type": "string"},
                                           "tags": TAGS, "provenance": CITATIONS, "reason": {"type": "string"}},
          "required": ["memory_id", "title", "text", "provenance"]}, propose_edit),
    ("propose_merge", "Propose one memory that replaces several overlapping ones.",
         {"type": "object", "properties": {"memory_ids": {"type": "array", "items": {"type": "string"}}, "title": {"type": "string"},
                                           "text": {"type": "string"}, "tags": TAGS, "provenance": CITATIONS, "reason": {"type": "string"}},
          "required": ["memory_ids", "title", "text", "reason"]}, propose_merge),
    ("propose_retire", "Propose retiring a memory that is wrong or out of date (it stays in the history).",
         {"type": "object", "properties": {"memory_id": {"type": "string"}, "reason": {"type": "string"}, "provenance": CITATIONS},
          "required": ["memory_id", "reason"]}, propose_retire),
)


DREAM_TOOL_NAMES = tuple(name for name, *_ in SPECS)


def _threaded(store: MemoryStore, fn: Callable[..., ToolOutput]) -> Callable[[dict[str, Any], ToolContext], Any]:
    async def run(inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            return await asyncio.to_thread(fn, store, inp, ctx)
        except WorkbenchError as e:  # a bad argument the store refused: data for the model, not a crash
            return _out(str(e), True)

    return run


def dream_tools(store: MemoryStore) -> list[Tool]:
    """The dream tools, bound to `store`."""
    return [Tool(name, description, schema, _threaded(store, fn)) for name, description, schema, fn in SPECS]
