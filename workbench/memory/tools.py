"""The tools a dream session has: read other sessions and memories, propose changes.

Proposals are staged in the dream's own log (the tool result's details) and
committed by `commit_dream` together with the chunk's read positions, in one
transaction: a chunk cut off half-way leaves nothing behind, and a chunk
committed is never redone. In a chunk, `read_events` reads only the chunk's ranges. `dream_tools(store)` makes them for one store;
each runs in a worker thread, since it reads the log and the store with
blocking DuckDB calls that must stay off the server's event loop.
"""

from __future__ import annotations

import asyncio
import difflib
import uuid
from collections.abc import Callable, Collection
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal

from ..plugins.errors import WorkbenchError
from ..plugins.log import Event
from ..plugins.tools import Tool, ToolContext, ToolOutput
from .events import check_citations, normalize, render_event
from .mounts import Mount, dream_target, session_mounts, stores_of
from .relevance import contradictions
from .semantic import absorbed, other_facts, overlaps
from .store import LIVE, MemoryStore, field_problems, stamp

MAX_EVENTS = 200
MAX_RECALL_QUERY = 2000  # characters of a recall query
MAX_RECALL_RESULTS = 20
MAX_RECALL_TEXT = 1500  # characters of each recalled memory's text shown
MAX_MEMORIES_CHARS = 20_000  # what read_memories shows at once
PAGE = 50  # sessions list_sessions shows at a time
MAX_PAGE = 200
DUPLICATE_RATIO = 0.85


def _out(text: str, error: bool = False, **details: Any) -> ToolOutput:
    return ToolOutput([{"type": "text", "text": text}], is_error=error, details=details)


def dream_scope(ctx: ToolContext) -> list[str] | None:
    """The session ids this dream was asked to read (None: every non-dream session)."""
    return ((ctx.log.events(ctx.session_id, until=1)[0].payload.get("config") or {}).get("dream") or {}).get("sessions")


def stores(ctx: ToolContext | None, shared: Collection[str] = ()) -> tuple[str, tuple[Mount, ...]]:
    """(the store this session writes into, the stores it mounts), from its frozen config (no session: the default);
    `shared`: the server's shared stores, read-only in every session."""
    if ctx is None:
        return session_mounts(None, "chat", shared)[0].store, session_mounts(None, "chat", shared)
    config = ctx.log.events(ctx.session_id, until=1)[0].payload.get("config") or {}
    return dream_target(config), session_mounts(config, ctx.log.session(ctx.session_id)["kind"], shared)


def _chunk_range(ctx: ToolContext, sid: str) -> dict[str, Any] | None | Literal[False]:
    """The range of `sid` the dream's current chunk was given; None: the dream has no chunks; False: not in it."""
    chunks = ctx.log.events(ctx.session_id, types=["dream_chunk"])
    if not chunks:
        return None
    found: dict[str, Any] | None = next((r for r in chunks[-1].payload["ranges"] if r["session_id"] == sid), None)
    return found if found is not None else False


def staged(events: list[Event]) -> list[dict[str, Any]]:
    """The proposals a dream's tools accepted so far, read from its log."""
    return [e.payload["proposal"] for e in events
            if e.type == "tool_result" and not e.payload.get("is_error") and "proposal" in e.payload]


def list_sessions(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    scope = dream_scope(ctx)
    since, until, title, tag, cursor = (inp.get(k) for k in ("since", "until", "title", "tag", "cursor"))
    if any(v is not None and not isinstance(v, str) for v in (since, until, title, tag, cursor)):
        return _out("since, until, title, tag and cursor must be strings", True)
    order = inp.get("order") or store.settings.dream_order
    if order not in ("newest", "oldest"):
        return _out("order must be newest or oldest", True)
    limit = inp.get("limit") or PAGE
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return _out("limit must be a positive integer", True)
    try:
        until_at = datetime.fromisoformat(until).isoformat() if until else None
        # a page at a time over every session: the listing never stops silently (`more` gives the next page)
        page = ctx.log.sessions_page(ids=scope, kind="chat", text=title or None, updated_after=since or None,
                                     order="-created" if order == "newest" else "created", limit=min(limit, MAX_PAGE),
                                     cursor=cursor)
    except ValueError as e:
        return _out(f"{e}; since and until are ISO dates, e.g. 2026-11-30 or 2026-11-30T10:00; cursor as a listing gave it", True)
    rows = page["sessions"]
    if until_at:
        rows = [s for s in rows if s["created_at"] <= until_at]
    if tag:
        def tags(s: dict) -> list[str]:
            return ((ctx.log.events(s["id"], until=1)[0].payload.get("config") or {}).get("tags")) or []
        rows = [s for s in rows if tag in tags(s)]
    marks = store.bookmarks(stores(ctx)[0])
    lines = []
    for s in rows:
        read = marks.get(s["id"], 0)
        lines.append(f"{s['id']}  created={s['created_at'][:19]}  events={s['last_seq']}  read_until={read}  "
                     f"unread={max(0, s['last_seq'] - read)}  title={' '.join((s['title'] or '').split())}")
    more = f"more ({order} first): call list_sessions again with cursor={page['next']!r}" if page["next"] else ""
    if not lines:
        return _out("no sessions match" + (f" on this page; {more}" if more else ""))
    return _out("\n".join(lines + ([more] if more else [])))


def read_events(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    sid = inp.get("session_id")
    scope = dream_scope(ctx)
    if not isinstance(sid, str) or not ctx.log.has_session(sid) or (scope is not None and sid not in scope):
        return _out(f"no session {sid!r} in this dream; list_sessions shows the ids", True)
    chunk = _chunk_range(ctx, sid)
    if chunk is False:
        return _out(f"session {sid} is not in this chunk; read the ranges this chunk's message names "
                    "(a later chunk reads the rest)", True)
    marks = store.bookmarks(stores(ctx)[0])
    after = inp.get("after", chunk["after"] if chunk else marks.get(sid, 0))
    until, search = inp.get("until"), inp.get("search")
    limit = inp.get("limit") or 50
    bad = [k for k, v in (("after", after), ("until", until), ("limit", limit))
           if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**62)]
    if bad or (search is not None and not isinstance(search, str)):
        return _out(f"{', '.join(bad) or 'search'}: after, until and limit must be non-negative integers, search a string", True)
    limit = min(max(limit, 1), MAX_EVENTS)
    if chunk:  # a chunk bounds what the dream's context holds: nothing outside its range
        after, until = max(after, chunk["after"]), chunk["until"] if until is None else min(until, chunk["until"])
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
    target, mounts = stores(ctx, store.shared)
    rows = store.list(status=inp.get("status"), tag=inp.get("tag"), search=inp.get("search"), store=stores_of(mounts))
    if not rows:
        return _out("no memories match")
    access = {m.store: m.access for m in mounts}
    blocks: list[str] = []
    size = 0
    for m in reversed(rows):  # newest first, within a budget: a dream's context holds a chunk, not every memory
        where = "" if m["store"] == target else f", store {m['store']}, {access[m['store']].replace('_', '-')}"
        block = (f"[{m['id']}] ({m['status']}{where}) {m['title']}\n  tags: {', '.join(m['tags'])}\n  "
                 + m["text"].replace("\n", "\n  "))
        if size + len(block) > MAX_MEMORIES_CHARS and blocks:
            blocks.append(f"({len(rows) - len(blocks)} older memories not shown: filter with search, tag or status)")
            break
        blocks.append(block)
        size += len(block) + 2
    return _out("\n\n".join(blocks))


def _says_it(mid: str, status: str, title: str) -> str:
    return (f"memory {mid} ({status}) already says this: {title!r}. Do not propose it again; "
            f"if it needs changing, use propose_edit with memory_id {mid}")


def _duplicate(store: MemoryStore, pending: list[dict[str, Any]], title: str, text: str, skip: set[str],
               target: str) -> str | None:
    """Why this looks like a memory that exists in the target store or is staged, or None: the same title,
    nearly the same text, or (staged) an overlap (semantic.py)."""
    candidates = [(m["id"], m["status"], m["title"], m["text"]) for m in store.list(store=target, annotate=False)
                  if m["id"] not in skip]
    candidates += [(p["memory_id"], "staged in this dream", p["title"], p["text"]) for p in pending]
    for mid, status, t, x in candidates:
        if normalize(t) == normalize(title) or (
                difflib.SequenceMatcher(None, normalize(x), normalize(text)).ratio() >= DUPLICATE_RATIO
                and not other_facts({"title": t, "text": x}, {"title": title, "text": text})):  # "use pandas"/"use polars"
            return _says_it(mid, status, t)
    staged_ones = [{"id": p["memory_id"], "version": 0, **p} for p in pending if p["proposal"] != "retire"]
    found = overlaps(title, text, staged_ones, store.embeddings)  # the most similar first
    return _says_it(found[0].memory["id"], "staged in this dream", found[0].memory["title"]) if found else None


def _absorb(store: MemoryStore, inp: dict[str, Any], title: str, text: str, provenance: list[dict[str, Any]],
            target: str) -> dict[str, Any] | str | None:
    """A new memory that overlaps live memories of the target store (semantic.py) as the edit or merge of
    them it becomes; a refusal when it says nothing they do not, with no new evidence; None: no overlap."""
    live = [m for m in store.list(store=target, annotate=False) if m["status"] in LIVE]
    found = overlaps(title, text, live, store.embeddings)
    if not found:
        return None
    tags = inp.get("tags") or []
    change = absorbed(found, title, text, tags, [{"session_id": c["session_id"], "seq": c["seq"], "quote": c["quote"]}
                                                 for c in provenance])
    if change is None:
        return _says_it(found[0].memory["id"], found[0].memory["status"], found[0].memory["title"])
    problems = field_problems(change["title"], change["text"], change["tags"])
    if problems:
        return (f"it overlaps memories {', '.join(change['targets'])}, but their merge cannot be one memory "
                f"({'; '.join(problems)}): propose_edit one of them instead")
    return change


def _propose(kind: str, store: MemoryStore, inp: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    scope = dream_scope(ctx)
    target, mounts = stores(ctx, store.shared)
    access = {m.store: m.access for m in mounts}
    if access.get(target) != "read_write":
        how = "mounts it read-only" if target in access else "does not mount it"
        return _out(f"not proposed:\n- this session writes into store {target!r}, and {how}: "
                    "no memory can be proposed here", True)
    pending = staged(ctx.log.events(ctx.session_id))
    named = (inp.get("memory_ids") if kind == "merge" else [inp.get("memory_id")] if kind != "create"
             else inp.get("supersedes") or [])
    if kind == "create" and not isinstance(named, list):
        return _out("not proposed:\n- supersedes must be a list of memory ids", True)
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
        if m is None or m["store"] not in access:  # a store not mounted is not there for this session
            problems.append(f"there is no memory {t!r}; read_memories shows the ids")
            continue
        if m["store"] != target:
            problems.append(f"memory {t} is in store {m['store']!r}, which this session mounts "
                            f"{access[m['store']].replace('_', '-')}: it cannot be changed here (proposals go into "
                            f"store {target!r}); propose_memory a new memory instead")
            continue
        current[t] = m
        if m["status"] not in ("accepted", "proposed"):
            problems.append(f"memory {t} is {m['status']}; only accepted or proposed memories can change")
        elif kind == "create" and m["status"] != "accepted":
            problems.append(f"memory {t} is {m['status']}; supersedes names accepted memories this one replaces")
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
    if not problems:  # a memory reaches every later prompt: no vault value, no likely secret (memory/secretscan.py)
        problems += [f"{p}; a memory must not hold a credential: propose it without the value (say where it is kept "
                     "instead), or drop it" for p in store.secret_problems(title, text)]
        if kind in ("edit", "merge") and isinstance(inp.get("reason"), str):
            problems += store.scanner.problems(inp["reason"], "reason")
    provenance = inp.get("provenance")
    problems += check_citations(ctx.log, provenance, scope=scope, required=kind in ("create", "edit"))
    merged: dict[str, Any] | None = None
    if not problems and kind == "create":
        assert isinstance(title, str) and isinstance(text, str), "checked above"
        # a new memory that says part of, all of or the same as live ones is a new version of them, not another
        found = None if targets else _absorb(store, inp, title, text, provenance or [], target)
        dup = found if isinstance(found, str) else None if found else _duplicate(store, pending, title, text,
                                                                                   skip=set(current), target=target)
        if dup:
            problems.append(dup)
        merged = found if isinstance(found, dict) else None
        marks = store.bookmarks(target)
        if all(c["seq"] <= marks.get(c["session_id"], 0) for c in provenance or []):
            problems.append("every cited event was read by an earlier dream, whose proposals were already made; "
                            "propose memories only from events after read_until (list_sessions shows it)")
    if problems:
        return _out("not proposed:\n" + "\n".join(f"- {p}" for p in problems), True)
    assert isinstance(title, str) and isinstance(text, str), "checked above"
    provenance = [{"session_id": c["session_id"], "seq": c["seq"], "quote": c["quote"]} for c in provenance or []]
    if kind == "merge":
        provenance = [c for t in targets for c in current[t]["provenance"]] + provenance
    if merged:
        kind, targets, title, text, provenance = (merged[k] for k in ("kind", "targets", "title", "text", "provenance"))
        inp = {**inp, "tags": merged["tags"], "reason": merged["note"]}
        current.update({m: store.get(m) for m in targets})
    # a contradiction with a live memory the proposal does not replace: the reviewer sees both side by side
    live = [m for m in store.list(store=target, annotate=False) if m["status"] in LIVE and m["id"] not in current]
    conflicts = contradictions({"id": "", "title": title.strip(), "text": text.strip()}, live) if kind != "retire" else []
    proposal = {
        "memory_id": "m" + uuid.uuid4().hex[:10], "proposal": kind, "title": title.strip(), "text": text.strip(),
        "tags": inp.get("tags") or [], "provenance": provenance, "targets": list(targets), "note": inp.get("reason"),
        "store": target,
    }
    what = {"create": "new memory", "edit": f"edit of {targets[0] if targets else ''}",
            "merge": f"merge of {', '.join(targets)}", "retire": f"retirement of {targets[0] if targets else ''}"}[kind]
    if kind == "create" and targets:
        what += f", superseding {', '.join(targets)}"
    if merged:
        what += f"; {merged['note']}"
    warn = "".join(f"\nit contradicts memory {c['id']} ({c['status']}) {c['title']!r}: {c['why']}. If the new fact replaces it, "
                   f"propose_retire {c['id']} or call propose_memory with supersedes=[{c['id']!r}] instead" for c in conflicts)
    return _out(f"staged {proposal['memory_id']} ({what}): it is proposed for review when this chunk ends{warn}", proposal=proposal)


def recall(store: MemoryStore, inp: dict[str, Any], ctx: ToolContext | None) -> ToolOutput:
    """Accepted memories ranked by relevance to a query (stemmed BM25 and embeddings, semantic.recall_rank), with
    their ids, dates and sources; bounded."""
    query, limit = inp.get("query"), inp.get("limit", store.settings.recall_results)
    if not isinstance(query, str) or not query.strip():
        return _out("query must be a non-empty string: the words to look for", True)
    if len(query) > MAX_RECALL_QUERY:
        return _out(f"query is {len(query):,} characters; a recall query takes at most {MAX_RECALL_QUERY:,}", True)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECALL_RESULTS:
        return _out(f"limit must be an integer from 1 to {MAX_RECALL_RESULTS}", True)
    mounted = stores_of(stores(ctx, store.shared)[1])  # only what the session mounts, read-only or read-write
    found = store.recall(query, mounted, limit)
    if not found:
        return _out("no accepted memory matches; try other words (memories are searched by title, text and tags)",
                    recalled=[])
    blocks = []
    for m, score in found:
        body, cut = m["text"][:MAX_RECALL_TEXT], len(m["text"]) - MAX_RECALL_TEXT
        body += f" [... {cut:,} more characters]" if cut > 0 else ""
        blocks.append(f"[{m['id']}] {m['title']} ({stamp(m)}; score {score:.2f})\n  " + body.replace("\n", "\n  "))
    return _out("\n\n".join(blocks), recalled=[{"id": m["id"], "store": m["store"], "version": m["version"], "score": round(s, 4)}
                                              for m, s in found])


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
    ("list_sessions", "List the sessions this dream may read, a page at a time, with how far earlier dreams read each "
                      "(read_until) and how many events are unread.",
         {"type": "object", "properties": {"since": {"type": "string", "description": "ISO date: only sessions active since"},
                                           "until": {"type": "string", "description": "ISO date: only sessions created before"},
                                           "title": {"type": "string", "description": "text the title contains"},
                                           "tag": {"type": "string", "description": "a tag in the session's config.tags"},
                                           "order": {"type": "string", "enum": ["newest", "oldest"],
                                                     "description": "newest or oldest sessions first (default: dream_order)"},
                                           "cursor": {"type": "string", "description": "the page after the one that gave it"},
                                           "limit": {"type": "integer",
                                                     "description": f"sessions per page (default {PAGE}, at most {MAX_PAGE})"}}},
         list_sessions),
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
                       "(not a guess, not a dead end). A person reviews it. If it corrects accepted memories, "
                       "name them in supersedes: they stop being injected when it is accepted.",
         {"type": "object", "properties": {"title": {"type": "string"}, "text": {"type": "string"}, "tags": TAGS, "provenance": CITATIONS,
                                           "supersedes": {"type": "array", "items": {"type": "string"},
                                                          "description": "ids of accepted memories this one replaces"}},
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


RECALL_SCHEMA = MappingProxyType({
    "type": "object",
    "properties": {"query": {"type": "string", "description": f"what to look for (at most {MAX_RECALL_QUERY} characters)"},
                   "limit": {"type": "integer", "description": f"how many memories, 1 to {MAX_RECALL_RESULTS}"}},
    "required": ["query"],
})


def recall_tool(store: MemoryStore) -> Tool:
    """`recall`: search accepted memories on demand, for any session that names it among its tools."""
    return Tool("recall", "Search the accepted memories of earlier sessions (reviewed by people) by words and meaning: the most "
                          "relevant come first, each with its id, when it was accepted and the sessions it came from. "
                          "Check a recalled fact against what you see before relying on it.",
                dict(RECALL_SCHEMA), _threaded(store, recall), concurrent=True)
