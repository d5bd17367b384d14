"""Dreams: ordinary brain sessions (kind "dream") that read other sessions and propose memories.

A dream works in **chunks**: `drive_dream` picks the next unread events in the dream's scope (newest
or oldest sessions first, `dream_order`), at most `dream_chunk_sessions` sessions and
`dream_chunk_chars` characters of them, records the plan (`dream_chunk`) and runs one turn over it
with a fresh context (context mode `turn`). When the turn ends normally, `commit_dream` writes
that chunk's staged proposals, its `memory_proposed` and `dream_read` events and its read positions
in ONE transaction; then the next chunk. A dream cut off anywhere repeats at most its current chunk;
committing twice does nothing, so it commits exactly once. When nothing is left, `dream_ended`.
A `DreamScheduler` can start dreams in the background after every N finished sessions; never on
the path of a user's turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from ..plugins import PluginBrain as Brain
from ..plugins.errors import ConfigError, TurnBusy, WorkbenchError
from ..plugins.log import Event
from ..plugins.models import default_model_name
from .events import normalize, render_event
from .mounts import dream_mounts, dream_target
from .store import MemorySettings, MemoryStore
from .tools import DREAM_TOOL_NAMES, staged

log_ = logging.getLogger(__name__)

# a trailing backslash only wraps the source: the model reads each paragraph as one line
DREAM_SYSTEM = """You are dreaming: reading other agents' past sessions in this workbench and proposing memories for future sessions.

A memory is a short, durable, checked fact that would save a future session time: an error and the fix that worked, \
a library or file that a task needs, a preference the user stated. Not a guess, not a dead end, not a restatement of a system prompt.

You work in chunks: each message names the events of one chunk; read them (and read_memories to see what is known).
1. read_events for each range the message names (list_sessions shows every session, page by page, if you need to look around).
2. propose_memory for each new fact, citing the events that show it: session_id, seq and a quote copied exactly from that event. \
If a tool refuses a proposal, read its reason and fix the proposal or drop it.
3. propose_edit / propose_merge / propose_retire when an existing memory is wrong, overlapping or out of date.
4. End with a short summary of what you proposed and why. People review every proposal."""

DEFAULT_INSTRUCTIONS = "Dream over the sessions you can read: propose memories for what is new."
CHUNK_HEAD = "This chunk's unread events (later chunks read the rest):"
CHUNK_LINE = re.compile(r"^- read_events (\{.*\})$", re.M)
ORDERS = MappingProxyType({"newest": "-created", "oldest": "created"})
MIN_CHUNK_CHARS = 4000  # one event as a dream reads it is at most about 2,100 characters
# how a dream stands, from its log (plus whether a host runs it now)
STATES = ("running", "done", "stopped", "cancelled", "unfinished")


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


def segment(events: list[Event]) -> list[Event]:
    """The events of the dream's latest chunk: after its last `dream_chunk` (all of them if it has none)."""
    starts = [i for i, e in enumerate(events) if e.type == "dream_chunk"]
    return events[starts[-1]:] if starts else events


def chunk_ranges(events: list[Event]) -> list[dict[str, Any]] | None:
    """The ranges the latest chunk was given (None: a dream without chunks may read anything in scope)."""
    chunks = [e for e in events if e.type == "dream_chunk"]
    return chunks[-1].payload["ranges"] if chunks else None


def _ended_normally(seg: list[Event]) -> bool:
    marks = [e for e in seg if e.type in ("user_message", "turn_ended")]
    return bool(marks) and marks[-1].type == "turn_ended" and marks[-1].payload.get("stop_reason") == "end_turn"


def _summary(dream_id: str, **kw: Any) -> dict[str, Any]:
    return {"dream_id": dream_id, "proposed": [], "read": {}, "committed_before": False, "committed": False, **kw}


def commit_dream(store: MemoryStore, dream_id: str) -> dict[str, Any]:
    """Commit the dream's latest chunk, if its turn ended normally: its proposals and read positions in one
    transaction (idempotent: a chunk already committed, or a dream that ended, is left as it is)."""
    actor = f"dream:{dream_id}"
    target = dream_target(dream_config_full(store, dream_id))

    def _commit(tx: Any) -> dict[str, Any]:
        events = tx.events(dream_id)
        seg = segment(events)
        done = [e for e in seg if e.type == "dream_read"]
        if done or any(e.type in ("dream_ended", "dream_cancelled") for e in events):
            last = done[-1].payload if done else {"sessions": {}, "proposals": []}
            return _summary(dream_id, proposed=last.get("proposals", []), read=last["sessions"], committed_before=True)
        if not _ended_normally(seg):
            return _summary(dream_id)  # cut off, or still running: nothing is recorded, the chunk repeats
        # read positions as committed now, in this transaction: another dream may have committed since
        # this chunk staged its proposals, and what it read is not proposed twice
        marks = dict(tx.execute("SELECT session_id, max(last_seq) FROM dream_reads WHERE store = ? GROUP BY session_id",
                                [target]).fetchall())
        titles = {normalize(r[0]) for r in tx.execute("SELECT title FROM memories WHERE store = ?", [target]).fetchall()}
        proposed, dropped = [], []
        for p in staged(seg):
            cited = [{"session_id": c["session_id"], "seq": c["seq"]} for c in p["provenance"]]
            if p["proposal"] == "create":
                why = ("already read by another dream" if cited and all(c["seq"] <= marks.get(c["session_id"], 0) for c in cited)
                       else "a memory with this title exists" if normalize(p["title"]) in titles else None)
                if why:
                    dropped.append({"memory_id": p["memory_id"], "title": p["title"], "why": why})
                    continue
                titles.add(normalize(p["title"]))
            store.tx_create(tx, title=p["title"], text=p["text"], tags=p["tags"], actor=actor, provenance=p["provenance"],
                            proposal=p["proposal"], targets=p["targets"], dream_id=dream_id, note=p.get("note"), memory_id=p["memory_id"],
                            store=target)
            tx.append(dream_id, "memory_proposed", {"memory_id": p["memory_id"], "action": p["proposal"], "title": p["title"],
                                                    "targets": p["targets"], "provenance": cited})
            proposed.append(p["memory_id"])
        read = read_positions(seg, marks)
        now = datetime.now(UTC).replace(tzinfo=None)
        for sid, seq in read.items():
            # a session split over two chunks of one dream is read in both
            tx.execute("INSERT INTO dream_reads (dream_id, session_id, last_seq, ts, store) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (dream_id, session_id) "
                       "DO UPDATE SET last_seq = greatest(dream_reads.last_seq, excluded.last_seq), ts = excluded.ts",
                       [dream_id, sid, seq, now, target])
        chunk = seg[0].seq if seg and seg[0].type == "dream_chunk" else 0
        payload: dict[str, Any] = {"sessions": read, "proposals": proposed, "chunk": chunk}
        if dropped:
            payload["dropped"] = dropped
        tx.append(dream_id, "dream_read", payload)
        return _summary(dream_id, proposed=proposed, read=read, committed=True)

    result = store.log.write(_commit).result()
    if store.settings.auto_accept and result["committed"]:
        for mid in result["proposed"]:
            store.review(mid, "accept", "auto-accept")
    return result


def _offered(events: list[Event]) -> dict[str, int]:
    """How far this dream's committed chunks went in each session (given, whether or not the model read it all)."""
    out: dict[str, int] = {}
    plan: list[dict[str, Any]] = []
    for e in events:
        if e.type == "dream_chunk":
            plan = e.payload["ranges"]
        elif e.type == "dream_read":
            for r in plan:
                out[r["session_id"]] = max(out.get(r["session_id"], 0), r["until"])
            plan = []
    return out


def dream_config_full(store: MemoryStore, dream_id: str) -> dict[str, Any]:
    """The dream session's whole config, frozen at its creation."""
    first = store.log.events(dream_id, until=1)
    return dict(first[0].payload.get("config") or {}) if first else {}


def dream_config(store: MemoryStore, dream_id: str) -> dict[str, Any]:
    """The dream's own settings, frozen at its creation (`config.dream`: sessions, instructions, store)."""
    return dict(dream_config_full(store, dream_id).get("dream") or {})


def next_chunk(store: MemoryStore, dream_id: str, events: list[Event] | None = None) -> list[dict[str, Any]]:
    """The next chunk's ranges: [{session_id, after, until}], unread by any dream and not yet given to this one;
    [] when nothing is left. Pages over every session in scope: no cap but the chunk's own bounds."""
    settings: MemorySettings = store.settings
    if settings.dream_order not in ORDERS:
        raise ConfigError(f"dream_order must be newest or oldest, not {settings.dream_order[:40]!r}")
    budget, most = max(settings.dream_chunk_chars, MIN_CHUNK_CHARS), max(settings.dream_chunk_sessions, 1)
    events = store.log.events(dream_id) if events is None else events
    config = dream_config_full(store, dream_id)
    scope = (config.get("dream") or {}).get("sessions")
    marks, given = store.bookmarks(dream_target(config)), _offered(events)
    ranges: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = store.log.sessions_page(ids=scope, kind="chat", order=ORDERS[settings.dream_order], limit=200, cursor=cursor)
        for s in page["sessions"]:
            pos = max(marks.get(s["id"], 0), given.get(s["id"], 0))
            if s["last_seq"] <= pos:
                continue
            until = pos
            size = 200  # the header read_events writes
            for e in store.log.events(s["id"], after=pos, until=s["last_seq"]):
                size += len(render_event(e)) + 1
                if size > budget and (until > pos or ranges):
                    break  # at least one event per chunk, so a chunk never comes out empty
                until = e.seq
            if until == pos:
                return ranges  # the chunk is full
            ranges.append({"session_id": s["id"], "after": pos, "until": until})
            budget -= size
            if budget <= 200 or len(ranges) >= most:
                return ranges
        cursor = page["next"]
        if cursor is None:
            return ranges


def has_unread(store: MemoryStore, target: str | None = None) -> bool:
    """Whether any chat session has events no dream into `target` (default: `dream_store`) has read (what a
    scheduled dream would read)."""
    marks, cursor = store.bookmarks(target or store.settings.dream_store), None
    while True:
        page = store.log.sessions_page(kind="chat", limit=500, cursor=cursor)
        if any(s["last_seq"] > marks.get(s["id"], 0) for s in page["sessions"]):
            return True
        cursor = page["next"]
        if cursor is None:
            return False


def chunk_text(ranges: list[dict[str, Any]], instructions: str | None) -> str:
    """The user message that opens a chunk's turn: what to look for, then exactly what to read."""
    return "\n".join([instructions or DEFAULT_INSTRUCTIONS, "", CHUNK_HEAD,
                      *(f"- read_events {json.dumps(r)}" for r in ranges), "",
                      "Propose memories from these events only. When you end your turn, this chunk's proposals "
                      "and reading are committed, and the next chunk comes in a fresh conversation."])


def create_dream(brain: Brain, store: MemoryStore, *, sessions: list[str] | None = None, model: str | None = None,
                 title: str | None = None, instructions: str | None = None, target: str | None = None,
                 read_only: list[str] | None = None) -> str:
    """Create a dream session (not yet run) that proposes into store `target` (default: `dream_store`), mounting
    the stores `read_only` names read-only (it reads them, never changes them); returns its id."""
    mounts = dream_mounts(target or store.settings.dream_store, read_only)  # ConfigError on a bad name
    store.refuse_shared(mounts[0].store)  # a shared store is written by its maintainer's dream, in their own log
    if sessions is not None:
        sessions = list(dict.fromkeys(sessions))
        for sid in sessions:
            s = store.log.session(sid)
            if s["kind"] == "dream":
                raise ConfigError(f"session {sid} is a dream; dreams read chat sessions")
        if len(sessions) > store.settings.dream_max_sessions:
            raise ConfigError(f"{len(sessions)} sessions; a dream reads at most {store.settings.dream_max_sessions} (dream_max_sessions)")
    if store.settings.dream_order not in ORDERS:
        raise ConfigError(f"dream_order must be newest or oldest, not {store.settings.dream_order[:40]!r}")
    model = model or store.settings.dream_model or default_model_name()
    into = f" into {mounts[0].store}" if mounts[0].store != "default" else ""
    title = title or ("dream over " + (", ".join(sessions) if sessions else "all sessions"))[:80 - len(into)] + into
    # each chunk is a turn of its own, with a fresh context: a dream's requests stay within one chunk's size
    config = {"dream": {"sessions": sessions, "instructions": instructions, "store": mounts[0].store}, "context": "turn",
              "memory": {"stores": [{"name": m.store, "access": m.access} for m in mounts]}}
    s = brain.create_session(title=title, model=model, system=DREAM_SYSTEM, tools=list(DREAM_TOOL_NAMES), config=config,
                             kind="dream")
    return s["id"]


async def _finish_cut_off_turn(brain: Brain, dream_id: str) -> str | None:
    """Finish the dream's cut-off turn (a chunk killed mid-way); its stop reason, None if there was none."""
    try:
        return await brain.resume(dream_id)
    except TurnBusy:  # another resume (a server waking cut-off turns) got there first: wait for it
        return await brain.wait_turn(dream_id)


def _totals(dream_id: str, events: list[Event]) -> dict[str, Any]:
    """What the dream's committed chunks proposed and read (whoever committed them: this driver, or a host's start)."""
    reads = [e.payload for e in events if e.type == "dream_read"]
    read: dict[str, int] = {}
    for r in reads:
        read.update(r["sessions"])
    return {"dream_id": dream_id, "proposed": [m for r in reads for m in r.get("proposals", [])], "read": read,
            "chunks": len(reads)}


async def drive_dream(brain: Brain, store: MemoryStore, dream_id: str, instructions: str | None = None,
                      stopping: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Run a dream, or go on with one cut off anywhere, chunk by chunk to its end; a summary with the stop reason.

    Each chunk is committed when its turn ends normally. A chunk whose turn stops otherwise (interrupted,
    a model error, max_tokens) stops the dream with nothing of that chunk recorded: resuming it reads
    the chunk again."""
    config = await asyncio.to_thread(dream_config, store, dream_id)
    instructions = instructions or config.get("instructions")

    async def ended(stop: str) -> dict[str, Any]:
        return dict(_totals(dream_id, await store.log.aevents(dream_id, types=["dream_read"])), stop_reason=stop)

    if await store.log.aevents(dream_id, types=["dream_cancelled"]):
        return await ended("cancelled")  # not even its cut-off chunk goes on
    stop = await _finish_cut_off_turn(brain, dream_id)
    while True:
        if stop not in (None, "end_turn"):
            return await ended(stop)
        await asyncio.to_thread(commit_dream, store, dream_id)
        events = await store.log.aevents(dream_id)
        if any(e.type == "dream_cancelled" for e in events):
            return await ended("cancelled")
        if any(e.type == "dream_ended" for e in events):
            return await ended("end_turn")
        if stopping():  # the host closes: the next chunk waits for a resume
            return await ended("interrupted")
        ranges = await asyncio.to_thread(next_chunk, store, dream_id, events)
        if not ranges:
            total = _totals(dream_id, events)
            await store.log.aappend(dream_id, "dream_ended", {"chunks": total["chunks"], "proposals": total["proposed"]})
            return dict(total, stop_reason="end_turn")
        await store.log.aappend(dream_id, "dream_chunk", {"ranges": ranges})
        stop = await brain.run_turn(dream_id, chunk_text(ranges, instructions))


async def run_dream(brain: Brain, store: MemoryStore, dream_id: str, instructions: str | None = None) -> dict[str, Any]:
    """Run a created dream to its end, chunk by chunk, each committed; the summary with the stop reason."""
    return await drive_dream(brain, store, dream_id, instructions)


def dream_state(events: list[Event]) -> tuple[str, str | None]:
    """(state, stop reason of its latest turn) of a dream from its log alone: a host that runs it says `running`.

    done: it ended; cancelled; stopped: a chunk's turn ended otherwise than normally (resume reads that
    chunk again); unfinished: cut off mid-chunk or between chunks (resume it)."""
    ended = [e for e in events if e.type == "turn_ended"]
    stop = ended[-1].payload["stop_reason"] if ended else None
    if any(e.type == "dream_ended" for e in events):
        return "done", stop
    if any(e.type == "dream_cancelled" for e in events):
        return "cancelled", stop
    # an old dream (from before chunks) is done once committed
    if not any(e.type == "dream_chunk" for e in events) and any(e.type == "dream_read" for e in events):
        return "done", stop
    seg = segment(events)
    turns = [e for e in seg if e.type in ("user_message", "turn_ended")]
    if turns and turns[-1].type == "turn_ended" and turns[-1].payload.get("stop_reason") != "end_turn":
        return "stopped", stop
    return "unfinished", stop


def unfinished_dreams(store: MemoryStore) -> list[str]:
    """Dreams not done, cancelled or stopped: cut off mid-chunk or between chunks (a server start goes on with them)."""
    out = []
    for s in store.log.sessions(kind="dream"):
        events = store.log.events(s["id"], types=["user_message", "turn_ended", "dream_chunk", "dream_read", "dream_ended",
                                                  "dream_cancelled"])
        if dream_state(events)[0] == "unfinished":
            out.append(s["id"])
    return out


def uncommitted_dreams(store: MemoryStore) -> list[str]:
    """Dreams whose latest chunk's turn ended normally but was never committed (the process stopped in between)."""
    out = []
    for s in store.log.sessions(kind="dream"):
        events = store.log.events(s["id"], types=["user_message", "turn_ended", "dream_chunk", "dream_read", "dream_ended",
                                                  "dream_cancelled"])
        seg = segment(events)
        if (_ended_normally(seg) and not any(e.type == "dream_read" for e in seg)
                and not any(e.type in ("dream_ended", "dream_cancelled") for e in events)):
            out.append(s["id"])
    return out


def commit_finished_dreams(store: MemoryStore) -> list[dict[str, Any]]:
    """Commit every dream chunk that ended normally but was not committed; every host calls it at start."""
    return [commit_dream(store, d) for d in uncommitted_dreams(store)]


def cancel_dream(store: MemoryStore, dream_id: str, actor: str) -> bool:
    """Record that a dream is cancelled (no later chunk runs, no resume goes on); False if it was done or cancelled."""
    s = store.log.session(dream_id)
    if s["kind"] != "dream":
        raise ConfigError(f"session {dream_id} is not a dream")

    def _cancel(tx: Any) -> bool:
        if any(e.type in ("dream_ended", "dream_cancelled") for e in tx.events(dream_id)):
            return False
        tx.append(dream_id, "dream_cancelled", {"by": actor})
        return True

    return bool(store.log.write(_cancel).result())


def dream_status(store: MemoryStore, dream_id: str, running: bool = False) -> dict[str, Any]:
    """A dream session with its state (running, done, stopped, cancelled, unfinished) and its proposals."""
    s = store.log.session(dream_id)
    if s["kind"] != "dream":
        raise ConfigError(f"session {dream_id} is not a dream")
    events = store.log.events(dream_id, types=["user_message", "turn_ended", "dream_chunk", "dream_read", "dream_ended",
                                               "dream_cancelled"])
    state, stop = dream_state(events)
    read: dict[str, int] = {}
    for e in events:
        if e.type == "dream_read":
            read.update(e.payload["sessions"])
    return {"session": s, "store": dream_target(dream_config_full(store, dream_id)),
            "state": "running" if running and state not in ("done", "cancelled") else state, "stop_reason": stop,
            "chunks": sum(e.type == "dream_read" for e in events), "read": read, "proposals": store.list(dream=dream_id)}


def list_dreams(store: MemoryStore, running: Callable[[str], bool] = lambda _: False) -> list[dict[str, Any]]:
    """Every dream, oldest first, with its state, chunks and how many memories it proposed."""
    out = []
    for d in store.dreams():
        events = store.log.events(d["id"], types=["user_message", "turn_ended", "dream_chunk", "dream_read", "dream_ended",
                                                  "dream_cancelled"])
        state, stop = dream_state(events)
        out.append(dict(d, state="running" if running(d["id"]) and state not in ("done", "cancelled") else state, stop_reason=stop,
                        chunks=sum(e.type == "dream_read" for e in events),
                        store=dream_target(dream_config_full(store, d["id"]))))
    return out


class DreamScheduler:
    """Starts a background dream after every `dream_every` chat sessions that finished a turn.

    It hears `turn_ended` on the log's writer thread and hops to the event loop; what it
    reads from the log it reads off the loop; the dream it starts is an ordinary turn of
    the brain (interruptible, and awaited by the host's shutdown like any other).
    """

    def __init__(self, start: Callable[[list[str]], Any], store: MemoryStore, loop: asyncio.AbstractEventLoop,
                 background: Callable[[Any], Any]):
        self.start, self.store, self.loop, self.background = start, store, loop, background
        self.finished: dict[str, None] = {}  # the sessions not yet given to a dream, in the order they finished
        self._unsubscribe = store.log.subscribe(self._on_event)

    def _on_event(self, e: Event) -> None:
        if e.type == "turn_ended" and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                self.loop.call_soon_threadsafe(lambda: self.background(self._finished(e.session_id)))

    async def _finished(self, session_id: str) -> None:
        if (await asyncio.to_thread(self.store.log.session, session_id))["kind"] == "dream":
            return
        self.finished[session_id] = None
        # a dream reads at most dream_max_sessions: a larger dream_every, or sessions that waited while a dream
        # ran, start dreams of that many, the first to finish first (a batch over the cap was refused every
        # time, and the schedule stopped for good)
        most = max(1, self.store.settings.dream_max_sessions)
        if len(self.finished) >= min(self.store.settings.dream_every, most):
            batch = sorted(list(self.finished)[:most])
            for sid in batch:
                del self.finished[sid]
            try:
                await self.start(batch)
            except WorkbenchError as e:  # e.g. a dream still runs: these sessions wait for the next batch
                self.finished = {**dict.fromkeys(batch), **self.finished}
                log_.warning("background dream over %s not started: %s", batch, e)

    def close(self) -> None:
        self._unsubscribe()
