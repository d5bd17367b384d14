"""Dreams: ordinary brain sessions (kind "dream") that read other sessions and propose memories.

`run_dream` creates the session with the dream tools, runs one turn, then
`commit_dream` writes its staged proposals, the `memory_proposed` and
`dream_read` events and the read positions in ONE transaction. A
`DreamScheduler` can start dreams in the background after every N finished
sessions; never on the path of a user's turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ..brain import Brain
from ..brain.models import default_model_name
from ..errors import ConfigError, WorkbenchError
from ..log import Event
from .store import MemoryStore
from .tools import DREAM_TOOL_NAMES, staged

log_ = logging.getLogger(__name__)

# a trailing backslash only wraps the source: the model reads each paragraph as one line
DREAM_SYSTEM = """You are dreaming: reading other agents' past sessions in this workbench and proposing memories for future sessions.

A memory is a short, durable, checked fact that would save a future session time: an error and the fix that worked, \
a library or file that a task needs, a preference the user stated. Not a guess, not a dead end, not a restatement of a system prompt.

1. list_sessions, then read_events for the sessions with unread events (and read_memories to see what is known).
2. propose_memory for each new fact, citing the events that show it: session_id, seq and a quote copied exactly from that event. \
If a tool refuses a proposal, read its reason and fix the proposal or drop it.
3. propose_edit / propose_merge / propose_retire when an existing memory is wrong, overlapping or out of date.
4. End with a short summary of what you proposed and why. People review every proposal."""

DEFAULT_INSTRUCTIONS = "Dream over the sessions you can read: propose memories for what is new."


def read_positions(events: list[Event], marks: dict[str, int]) -> dict[str, int]:
    """How far the dream read each session contiguously, from the earlier bookmarks on."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        r = e.payload.get("read") if e.type == "tool_result" and not e.payload.get("is_error") else None
        if r:
            ranges.setdefault(r["session_id"], []).append((r["after"], r["until"]))
    out = {}
    for sid, rs in ranges.items():
        pos = marks.get(sid, 0)
        for after, until in sorted(rs):
            if after <= pos:
                pos = max(pos, until)
        if pos > marks.get(sid, 0):
            out[sid] = pos
    return out


def commit_dream(store: MemoryStore, dream_id: str) -> dict[str, Any]:
    """Write a finished dream's proposals and read positions in one transaction (idempotent)."""
    marks = store.bookmarks()
    actor = f"dream:{dream_id}"

    def _commit(tx: Any) -> dict[str, Any]:
        events = tx.events(dream_id)
        done = [e for e in events if e.type == "dream_read"]
        if done:
            return {"dream_id": dream_id, "proposed": done[-1].payload.get("proposals", []), "read": done[-1].payload["sessions"],
                    "committed_before": True}
        proposed = []
        for p in staged(events):
            store.tx_create(tx, title=p["title"], text=p["text"], tags=p["tags"], actor=actor, provenance=p["provenance"],
                            proposal=p["proposal"], targets=p["targets"], dream_id=dream_id, note=p.get("note"), memory_id=p["memory_id"])
            cited = [{"session_id": c["session_id"], "seq": c["seq"]} for c in p["provenance"]]
            tx.append(dream_id, "memory_proposed", {"memory_id": p["memory_id"], "action": p["proposal"], "title": p["title"],
                                                    "targets": p["targets"], "provenance": cited})
            proposed.append(p["memory_id"])
        read = read_positions(events, marks)
        now = datetime.now(UTC).replace(tzinfo=None)
        for sid, seq in read.items():
            tx.execute("INSERT INTO dream_reads VALUES (?, ?, ?, ?)", [dream_id, sid, seq, now])
        tx.append(dream_id, "dream_read", {"sessions": read, "proposals": proposed})
        return {"dream_id": dream_id, "proposed": proposed, "read": read, "committed_before": False}

    result = store.log.write(_commit).result()
    if store.settings.auto_accept and not result["committed_before"]:
        for mid in result["proposed"]:
            store.review(mid, "accept", "auto-accept")
    return result


def create_dream(brain: Brain, store: MemoryStore, *, sessions: list[str] | None = None, model: str | None = None,
                 title: str | None = None) -> str:
    """Create a dream session (not yet run); returns its id."""
    if sessions is not None:
        sessions = list(dict.fromkeys(sessions))
        for sid in sessions:
            s = brain.log.session(sid)
            if s["kind"] == "dream":
                raise ConfigError(f"session {sid} is a dream; dreams read chat sessions")
        if len(sessions) > store.settings.dream_max_sessions:
            raise ConfigError(f"{len(sessions)} sessions; a dream reads at most {store.settings.dream_max_sessions} (dream_max_sessions)")
    model = model or store.settings.dream_model or default_model_name()
    title = title or ("dream over " + (", ".join(sessions) if sessions else "all sessions"))[:80]
    config = {"dream": {"sessions": sessions}}
    s = brain.create_session(title=title, model=model, system=DREAM_SYSTEM, tools=list(DREAM_TOOL_NAMES), config=config,
                             kind="dream")
    return s["id"]


async def run_dream(brain: Brain, store: MemoryStore, dream_id: str, instructions: str | None = None) -> dict[str, Any]:
    """Run a created dream to its end and commit what it proposed; the commit summary with the stop reason."""
    stop = await brain.run_turn(dream_id, instructions or DEFAULT_INSTRUCTIONS)
    if stop != "end_turn":
        # a dream cut short may have read events it had not yet proposed from: record nothing,
        # so the next dream reads them again
        return {"dream_id": dream_id, "proposed": [], "read": {}, "committed_before": False, "stop_reason": stop}
    result = await asyncio.to_thread(commit_dream, store, dream_id)
    return dict(result, stop_reason=stop)


def uncommitted_dreams(store: MemoryStore) -> list[str]:
    """Dreams whose turn ended normally but whose proposals were never committed (the process stopped in between)."""
    out = []
    for s in store.log.sessions(kind="dream"):
        events = store.log.events(s["id"], types=["turn_ended", "dream_read"])
        if events and events[-1].type == "turn_ended" and events[-1].payload.get("stop_reason") == "end_turn":
            out.append(s["id"])
    return out


def commit_finished_dreams(store: MemoryStore) -> list[dict[str, Any]]:
    """Commit every dream that ended normally but was not committed; the server calls it at start and after resumed turns."""
    return [commit_dream(store, d) for d in uncommitted_dreams(store)]


def dream_status(store: MemoryStore, dream_id: str) -> dict[str, Any]:
    """A dream session with its state (running, done, stopped) and its proposals."""
    s = store.log.session(dream_id)
    if s["kind"] != "dream":
        raise ConfigError(f"session {dream_id} is not a dream")
    done = store.log.events(dream_id, types=["dream_read"])
    ended = store.log.events(dream_id, types=["turn_ended"])
    # a dream that ended normally is committed (dream_read) just after its turn_ended: until
    # then it is still running, not stopped
    stop = ended[-1].payload["stop_reason"] if ended else None
    state = "done" if done else ("stopped" if ended and stop != "end_turn" else "running")
    return {"session": s, "state": state, "stop_reason": ended[-1].payload["stop_reason"] if ended else None,
            "read": done[-1].payload["sessions"] if done else {}, "proposals": store.list(dream=dream_id)}


class DreamScheduler:
    """Starts a background dream after every `dream_every` chat sessions that finished a turn.

    It hears `turn_ended` on the log's writer thread and hops to the event loop; what it
    reads from the log it reads off the loop; the dream it starts is an ordinary turn of
    the brain (interruptible, and awaited by the host's shutdown like any other).
    """

    def __init__(self, start: Callable[[list[str]], Any], store: MemoryStore, loop: asyncio.AbstractEventLoop,
                 background: Callable[[Any], Any]):
        self.start, self.store, self.loop, self.background = start, store, loop, background
        self.finished: set[str] = set()
        self._unsubscribe = store.log.subscribe(self._on_event)

    def _on_event(self, e: Event) -> None:
        if e.type == "turn_ended" and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                self.loop.call_soon_threadsafe(lambda: self.background(self._finished(e.session_id)))

    async def _finished(self, session_id: str) -> None:
        if (await asyncio.to_thread(self.store.log.session, session_id))["kind"] == "dream":
            return
        self.finished.add(session_id)
        if len(self.finished) >= self.store.settings.dream_every:
            batch, self.finished = sorted(self.finished), set()
            try:
                await self.start(batch)
            except WorkbenchError as e:  # e.g. a dream still runs: these sessions wait for the next batch
                self.finished.update(batch)
                log_.warning("background dream over %s not started: %s", batch, e)

    def close(self) -> None:
        self._unsubscribe()
