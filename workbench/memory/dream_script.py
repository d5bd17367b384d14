"""`scripted:dream`: a deterministic, offline dream for demos and tests.

It uses the same tools a real model would: it lists the sessions, reads their
unread events and the memories, and proposes, each citing the events that show
it with a quote copied from them:

- an error in a tool result and the code that worked right after it;
- what the user stated: a preference ("always ...", "prefer ...", "never ..."),
  a note ("remember ...", "note: ...", "fyi ..."), an update ("update: ...",
  "... instead of ...");
- the third-party libraries the sessions imported.

A statement about what a memory already says changes that memory instead of
adding one (dream_statements.py says how "about" is decided, lexically):
an update is a `propose_edit` of it; a statement the other way round
supersedes it (`propose_memory` with `supersedes`, or an edit of a proposal);
one statement covering several memories merges them (`propose_merge`);
"forget ..." / "no longer ..." retires it (`propose_retire`); a repeat or a
paraphrase is left out. Within one chunk, the later statement wins.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from ..plugins.models import Reply, position
from .dream_statements import parse_memories, plan, statements

HEADER = re.compile(r'^== session (\S+) "(.*)": events', re.M)
EVENT = re.compile(r"^#(\d+) (\S+)(?: (\S+))?( \[error\])?$")
ERROR_LINE = re.compile(r"^(\w+(?:Error|Exception)): (.+)$", re.M)
IMPORT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", re.M)


def _text(content: Any) -> str:
    """The text of a tool result's content, whatever its shape (a string, blocks, nothing, anything else)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(x.get("text", "")) for x in content if isinstance(x, dict) and x.get("type") == "text")
    return "" if content is None else str(content)


def exchanges(request: dict[str, Any]) -> list[tuple[str, dict, str, bool]]:
    """Every (tool name, input, result text, is_error) of the request so far."""
    calls: dict[str, tuple[str, dict]] = {}
    out = []
    for m in request.get("messages", []):
        if not isinstance(m.get("content"), list):
            continue
        for b in m["content"]:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_use":
                inp = b.get("input")
                calls[str(b.get("id"))] = (str(b.get("name")), inp if isinstance(inp, dict) else {})
            elif b.get("type") == "tool_result":
                name, inp = calls.get(str(b.get("tool_use_id")), ("?", {}))
                out.append((name, inp, _text(b.get("content")), bool(b.get("is_error"))))
    return out


def parse_read(text: str) -> tuple[str, str, list[dict[str, Any]]]:
    """(session id, title, events) from a read_events result."""
    head = HEADER.search(text)
    if not head:
        return "", "", []
    events: list[dict[str, Any]] = []
    for line in text.splitlines()[1:]:
        m = EVENT.match(line)
        if m:
            events.append({"seq": int(m.group(1)), "type": m.group(2), "name": m.group(3), "error": bool(m.group(4)), "body": []})
        elif events and line.startswith("  "):
            events[-1]["body"].append(line[2:])
    for e in events:
        e["body"] = "\n".join(e["body"])
    return head.group(1), head.group(2), events


def _cite(sid: str, seq: int, quote: str) -> dict[str, Any]:
    return {"session_id": sid, "seq": seq, "quote": quote}


def find_facts(sid: str, title: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors worth remembering from one session's events, each with the call that fixed it."""
    facts = []
    for i, e in enumerate(events):
        if e["type"] == "tool_result" and e["error"]:
            errors = ERROR_LINE.findall(e["body"])
            if not errors:
                continue
            ename, evalue = errors[-1]
            fix = _next_success(events, i)
            if fix is None:
                continue
            line = max(fix["body"].splitlines(), key=len).strip()
            facts.append({
                "title": f"Fix for {ename}: {evalue}"[:80],
                "text": f"{ename}: {evalue} (session \"{title}\"). What worked right after:\n```python\n{fix['body']}\n```",
                "tags": ["error", ename.lower()],
                "provenance": [_cite(sid, e["seq"], f"{ename}: {evalue}"), _cite(sid, fix["seq"], line)],
            })
    return facts


def _next_success(events: list[dict[str, Any]], i: int) -> dict[str, Any] | None:
    """The next python call after events[i] whose result was not an error."""
    for j in range(i + 1, len(events)):
        e = events[j]
        if e["type"] == "tool_started" and e["name"] == "python" and len(e["body"].strip()) >= 8:
            result = next((r for r in events[j + 1:] if r["type"] == "tool_result"), None)
            if result is not None and not result["error"]:
                return e
    return None


def find_libraries(reads: list[tuple[str, str, list[dict[str, Any]]]]) -> dict[str, Any] | None:
    """One memory naming the third-party libraries the sessions imported."""
    seen: dict[str, tuple[str, str, int, str]] = {}
    for sid, title, events in reads:
        for e in events:
            if e["type"] == "tool_started" and e["name"] == "python":
                for line in e["body"].splitlines():
                    m = IMPORT.match(line)
                    if m and m.group(1) not in sys.stdlib_module_names and m.group(1) not in seen and len(line.strip()) >= 8:
                        seen[m.group(1)] = (sid, title, e["seq"], line.strip())
    if not seen:
        return None
    text = "Third-party libraries past sessions used:\n" + "\n".join(
        f"- {lib} (session \"{t}\")" for lib, (_, t, _, _) in sorted(seen.items()))
    return {"title": "Libraries used: " + ", ".join(sorted(seen))[:60], "text": text, "tags": ["libraries"],
            "provenance": [_cite(sid, seq, line) for sid, _, seq, line in seen.values()]}


CHUNK = re.compile(r"^- read_events (\{.*\})$", re.M)
LISTED = re.compile(r"^(\S+)\s+created=.*\bunread=(\d+)", re.M)
MORE = re.compile(r"cursor='([^']+)'")


def _chunk(text: str) -> list[dict[str, Any]]:
    """The read_events inputs a chunk's message names."""
    out = []
    for m in CHUNK.finditer(text):
        try:
            r = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(r, dict) and isinstance(r.get("session_id"), str):
            out.append({"session_id": r["session_id"], "limit": 200})
    return out


def _first_line_of_reason(text: str) -> str:
    """A refusal is "not proposed:" then one reason a line; other errors (an interrupted call) are one line, or none."""
    lines = [x for x in text.splitlines() if x.strip()]
    return (lines[1:] or lines or ["(no reason given)"])[0].lstrip("- ")


def _label(tool: str, inp: dict[str, Any]) -> str:
    """What a proposal was about, in a few words, whatever its input held: a new memory's title, else the change."""
    if tool == "propose_memory" and isinstance(inp.get("title"), str):
        return inp["title"]
    what = inp.get("memory_id") or inp.get("memory_ids") or inp.get("title") or "?"
    return f"{tool.removeprefix('propose_')} of {str(what)[:80]}"


def _flagged(text: str) -> str:
    """The contradictions the tool flagged in a staged proposal's result, left for the reviewer."""
    found = re.findall(r"^it contradicts memory (\S+)", text, re.M)
    return f" (contradicts {', '.join(found)}: for the reviewer)" if found else ""


def dream_script(request: dict[str, Any]) -> Reply:
    """Read the chunk's events (or list and read the unread ones), propose memories with citations, summarise.

    What to do next is decided by what was done so far in this turn, never by counting steps, and
    every tool result is taken as it comes: an error, empty, huge or not what a tool usually says."""
    _, _, text = position(request)
    done = exchanges(request)
    called = {n for n, *_ in done}
    if not done:
        chunk = _chunk(text)
        if chunk:
            return Reply(text=f"Reading this chunk: {len(chunk)} session(s).",
                         tool_calls=[("read_memories", {}), *(("read_events", r) for r in chunk)])
        return Reply(text="Let me see which sessions have unread events, and what is remembered already.",
                     tool_calls=[("list_sessions", {}), ("read_memories", {})])
    proposed = [(n, inp, t, err) for n, inp, t, err in done if n.startswith("propose_")]
    if proposed:
        ok = [p for p in proposed if not p[3]]
        lines = [f"- {_label(n, inp)}: {'refused: ' + _first_line_of_reason(t) if err else 'proposed' + _flagged(t)}"
                 for n, inp, t, err in proposed]
        return Reply(text=f"Dream done: {len(ok)} of {len(proposed)} proposals staged for review.\n" + "\n".join(lines))
    if "read_events" not in called:
        listings = [t for n, _, t, err in done if n == "list_sessions" and not err]
        more = MORE.search(listings[-1]) if listings else None
        if more and len(listings) < 1000:  # every page, not just the first
            return Reply(text="The next page of sessions.", tool_calls=[("list_sessions", {"cursor": more.group(1)})])
        unread = list(dict.fromkeys(m.group(1) for t in listings for m in LISTED.finditer(t) if int(m.group(2)) > 0))
        if not unread:
            return Reply(text="Nothing new to read: every session is read up to its last event. No proposals.")
        return Reply(text=f"Reading {len(unread)} session(s).",
                     tool_calls=[("read_events", {"session_id": sid, "limit": 200}) for sid in unread])
    known = "\n".join(t for n, _, t, err in done if n == "read_memories" and not err)
    reads = [parse_read(t) for n, _, t, err in done if n == "read_events" and not err]
    said = [st for sid, title, evs in reads if sid for e in evs if e["type"] == "user_message"
            for st in statements(sid, title, e["seq"], e["body"])]
    calls = plan(said, parse_memories(known))
    facts = [f for sid, title, evs in reads if sid for f in find_facts(sid, title, evs)]
    libs = find_libraries(reads)
    facts += [libs] if libs else []
    calls += [("propose_memory", f) for f in facts if f["title"] not in known]
    if not calls:
        return Reply(text=f"I read {len(reads)} session(s) and found nothing worth remembering.")
    return Reply(text=f"Proposing {len(calls)} change(s) to the memories.", tool_calls=calls)
