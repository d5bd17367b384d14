"""The memory store: memories and their full history, in the session log's DuckDB file.

Every change is a new row in `memory_versions` naming its actor; nothing is
deleted. The one in-place change is `redact` (a leaked secret, personal data): the
memory's title, text and quotes go from every version, every copy of them goes from
the session log (log/scrub.py) with a `redacted` tombstone in each session changed,
and the file is compacted so that no free block keeps them.
Writes run on the log's writer thread, one transaction each; reads use a
cursor of their own.
"""

from __future__ import annotations

# MemoryStore has a method named `list`; below it, the class's annotations reach the builtin as builtins.list
import builtins
import json
import os
import re
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from ..plugins.errors import ConfigError, MemoryConflict, SharedStoreReadOnly, UnknownMemory
from ..plugins.log import SESSION_ID, SqlLog, one_row, scrub_text
from .index import Indexes, MountIndex
from .relevance import contradictions, contradictions_among
from .secretscan import SecretScanner
from .semantic import Embeddings
from .sources import cited_sentences, fragments

SCHEMA = """
CREATE TABLE IF NOT EXISTS memory_items (
    id         VARCHAR PRIMARY KEY,
    created_at TIMESTAMP NOT NULL,
    created_by VARCHAR NOT NULL,
    proposal   VARCHAR NOT NULL,
    targets    VARCHAR[] NOT NULL,
    dream_id   VARCHAR,
    store      VARCHAR NOT NULL DEFAULT 'default'
);
CREATE TABLE IF NOT EXISTS memory_versions (
    memory_id  VARCHAR NOT NULL,
    version    INTEGER NOT NULL,
    ts         TIMESTAMP NOT NULL,
    actor      VARCHAR NOT NULL,
    action     VARCHAR NOT NULL,
    title      VARCHAR NOT NULL,
    text       VARCHAR NOT NULL,
    tags       VARCHAR[] NOT NULL,
    status     VARCHAR NOT NULL,
    provenance JSON NOT NULL,
    note       VARCHAR,
    PRIMARY KEY (memory_id, version)
);
CREATE TABLE IF NOT EXISTS memory_redactions (
    memory_id  VARCHAR NOT NULL,
    version    INTEGER NOT NULL,
    ts         TIMESTAMP NOT NULL,
    actor      VARCHAR NOT NULL,
    reason     VARCHAR NOT NULL,
    versions   INTEGER[] NOT NULL
);
CREATE TABLE IF NOT EXISTS memory_links (
    memory_id  VARCHAR NOT NULL,
    by_id      VARCHAR NOT NULL,
    ts         TIMESTAMP NOT NULL,
    actor      VARCHAR NOT NULL,
    kind       VARCHAR NOT NULL,
    PRIMARY KEY (memory_id, by_id)
);
CREATE TABLE IF NOT EXISTS dream_reads (
    dream_id   VARCHAR NOT NULL,
    session_id VARCHAR NOT NULL,
    last_seq   BIGINT NOT NULL,
    ts         TIMESTAMP NOT NULL,
    store      VARCHAR NOT NULL DEFAULT 'default',
    PRIMARY KEY (dream_id, session_id)
);
CREATE TABLE IF NOT EXISTS memory_imports (
    id            VARCHAR PRIMARY KEY,
    ts            TIMESTAMP NOT NULL,
    actor         VARCHAR NOT NULL,
    store         VARCHAR NOT NULL,
    source_store  VARCHAR NOT NULL,
    exported_at   VARCHAR,
    exported_by   VARCHAR,
    memories      VARCHAR[] NOT NULL,
    skipped       JSON NOT NULL
);
-- databases from before stores: their memories and dreams' reads are in the store "default"
ALTER TABLE memory_items ADD COLUMN IF NOT EXISTS store VARCHAR DEFAULT 'default';
ALTER TABLE dream_reads ADD COLUMN IF NOT EXISTS store VARCHAR DEFAULT 'default';
CREATE OR REPLACE VIEW memories AS
SELECT i.id, v.title, v.text, v.tags, v.status, v.version, i.proposal, i.targets, i.dream_id,
       i.created_at, i.created_by, v.ts AS updated_at, v.actor AS updated_by, v.provenance, i.store
FROM memory_items i JOIN memory_versions v ON v.memory_id = i.id
QUALIFY row_number() OVER (PARTITION BY i.id ORDER BY v.version DESC) = 1;
"""

STATUSES = ("proposed", "accepted", "rejected", "superseded", "retired", "redacted")
PROPOSALS = ("create", "edit", "merge", "retire")
REVIEW_ACTIONS = ("accept", "reject", "edit", "merge", "retire", "redact", "supersede")
REDACTED = "[redacted]"
MIN_SCRUB = 8  # shorter texts (a title like "pandas") are not scrubbed from the log: they are everywhere
MAX_SOURCE_SESSIONS = 50  # sessions whose memories a redaction searches for parts of its source sentences
MIN_SCRUB_LINE = 16  # each line of a text this long is scrubbed too (renderings indent or split a text)
LIVE = ("accepted", "proposed")  # the statuses of memories that are, or may become, what sessions are told
# A name in an actor: words of letters and digits (of any script), `_ . @ + -`, one space between words.
# No markup, quote, control or format character: an actor is printed into prompts, panels and terminals.
ACTOR_NAME = r"[\w.@+-]+(?: [\w.@+-]+)*"
MAX_ACTOR_NAME_CHARS = 200
ACTOR = re.compile(rf"api|auto-accept|(?:dream|agent):{SESSION_ID[1:-1]}|(?:person|api):{ACTOR_NAME}")  # all of it: fullmatch
ACTOR_GRAMMAR = ("'api', 'auto-accept', 'dream:<session id>', 'agent:<session id>' (a session's memory tool), or "
                 "'person:<name>' / 'api:<name>' where a name is "
                 f"1 to {MAX_ACTOR_NAME_CHARS} characters: words of letters, digits and _ . @ + -, one space between words")
DEFAULT_STORE = "default"  # where every memory of a database from before stores is, and what a session mounts by default
STORE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


@dataclass
class MemorySettings:
    """Memory and dreaming; every field is documented in docs/settings.md."""

    inject: bool = True  # put accepted memories into the system prompt of new (non-dream) sessions
    inject_chars: int = 8000  # at most this many characters of memories per system prompt
    recall_results: int = 5  # how many memories the `recall` tool returns by default (at most 20)
    dream_model: str = ""  # the model dreams use; empty: the default model
    dream_every: int = 0  # start a dream after this many sessions finished a turn (0: never)
    dream_interval: float = 0.0  # the server starts a dream every this many seconds when events are unread (0: never)
    dream_max_sessions: int = 20  # at most this many sessions per dream
    auto_accept: bool = False  # accept a dream's proposals without review (actor `auto-accept`)
    dream_order: str = "newest"  # which unread sessions a dream reads first: newest or oldest
    dream_chunk_chars: int = 60_000  # at most this many characters of events a dream reads per chunk (one turn)
    dream_chunk_sessions: int = 20  # at most this many sessions per chunk
    dream_store: str = DEFAULT_STORE  # the store a dream writes its proposals into unless it names one
    # the stores whose memory-tool writes are accepted at once (comma-separated names, `*`: every store); the
    # writes of sessions to any other store are proposals a person reviews
    tool_accept_stores: str = ""
    # stores mounted read-only from files their maintainer publishes (NAME=PATH, comma-separated: memory/shared.py)
    shared_stores: str = ""
    shared_maintainer: str = ""  # who publishes them: a file exported by anyone else is not read (empty: not checked)

    def accepts_tool_writes(self, store: str) -> bool:
        """Whether a session's memory-tool write to `store` is accepted at once (else it is a proposal)."""
        names = {n.strip() for n in self.tool_accept_stores.split(",") if n.strip()}
        return "*" in names or store in names

    def check_tool_accept_stores(self) -> None:
        """ConfigError naming a store name in `tool_accept_stores` that no store can have."""
        for n in self.tool_accept_stores.split(","):
            if n.strip() and n.strip() != "*":
                try:
                    check_store(n.strip())
                except ConfigError as e:
                    raise ConfigError(f"WORKBENCH_MEMORY_TOOL_ACCEPT_STORES: {e}") from None


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _iso(ts: datetime) -> str:
    return ts.replace(tzinfo=UTC).isoformat()


def sessions_of(m: dict[str, Any], shown: int = 3) -> builtins.list[str]:
    """The distinct sessions a memory's provenance cites, in order (at most `shown`)."""
    return builtins.list(dict.fromkeys(c["session_id"] for c in m["provenance"] if isinstance(c, dict) and "session_id" in c))[:shown]


def held_back(accepted: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The accepted memories a newer accepted memory of the same store contradicts, by id: each with the
    newer one's id (`by`) and why they conflict (the detector's one line)."""
    out: dict[str, dict[str, Any]] = {}
    groups: dict[str, builtins.list[dict[str, Any]]] = {}
    for m in accepted:
        groups.setdefault(m.get("store") or DEFAULT_STORE, []).append(m)
    for rows in groups.values():
        by_id = {m["id"]: m for m in rows}
        for mid, found in contradictions_among(rows, rows).items():
            for c in found:
                older, newer = sorted((by_id[mid], by_id[c["id"]]), key=lambda x: (str(x["updated_at"]), x["id"]))
                if older["id"] not in out:
                    out[older["id"]] = {"id": older["id"], "version": older["version"], "title": older["title"],
                                        "by": newer["id"], "why": c["why"]}
    return out


def block(m: dict[str, Any]) -> str:
    """How a memory is shown in a session's system prompt (the injection)."""
    return f"\n## {m['title']} ({m['id']}, {stamp(m)})\n{m['text']}\n"


def stamp(m: dict[str, Any]) -> str:
    """`accepted 2026-11-30 by person:ann, from sessions a, b`: when and where from, compactly, for a prompt or a listing."""
    sources = sessions_of(m)
    more = len({c.get("session_id") for c in m["provenance"] if isinstance(c, dict)}) - len(sources)
    origin = f"from session{'s' if len(sources) > 1 else ''} {', '.join(sources)}" + (f" and {more} more" if more > 0 else "")
    return f"{m['status']} {m['updated_at'][:10]} by {m['updated_by']}" + (f"; {origin}" if sources else "; written by a person")


def is_actor(actor: Any) -> bool:
    """Whether `actor` follows the grammar of actors (ACTOR_GRAMMAR, docs/memory.md)."""
    return isinstance(actor, str) and len(actor) <= len("person:") + MAX_ACTOR_NAME_CHARS and ACTOR.fullmatch(actor) is not None


def check_actor(actor: str) -> str:
    """An actor is `api`, `auto-accept`, `dream:<session id>`, `person:<name>` or `api:<name>` (ACTOR_GRAMMAR)."""
    if not is_actor(actor):
        shown = repr(actor[:60]) if isinstance(actor, str) else f"a {type(actor).__name__}"
        raise ConfigError(f"actor {shown} is not valid: {ACTOR_GRAMMAR}")
    return actor


def check_store(name: Any) -> str:
    """A store's name: 1 to 40 characters of a-z, 0-9, `_` and `-`, starting with a letter or digit."""
    if not isinstance(name, str) or not STORE_NAME.match(name):
        shown = repr(name[:60]) if isinstance(name, str) else f"a {type(name).__name__}"
        raise ConfigError(f"store name {shown} is not valid: 1 to 40 characters of a-z, 0-9, '_' and '-', "
                          "starting with a letter or digit (e.g. 'default', 'team-data')")
    return name


def _store_names(store: str | Sequence[str] | None) -> builtins.list[str] | None:
    if store is None:
        return None
    names = builtins.list(store) if isinstance(store, (builtins.list, tuple)) else [store]
    return [check_store(n) for n in names]


def person(name: Any) -> str:
    """The actor of a person called `name` (an authenticated user): person:<name>, the name's characters outside
    the actor grammar each replaced by `-`, at most MAX_ACTOR_NAME_CHARS characters."""
    name = " ".join(unicodedata.normalize("NFC", str(name or "")).split())
    name = re.sub(r"[^\w.@+\- ]", "-", name)[:MAX_ACTOR_NAME_CHARS].strip()
    return f"person:{name or 'unknown'}"


def os_user() -> str:
    """The actor of whoever runs this process (the CLI, the local review panel): person:<OS user name>."""
    import getpass

    try:
        return person(getpass.getuser())
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER: the uid still names someone
        return person(f"uid-{os.getuid()}")


# How big a memory may be, wherever it comes from (a person, the API, a dream): every later dream
# and every new session's prompt carries what is accepted, so nothing unbounded gets in.
MAX_TITLE_CHARS = 200
MAX_TEXT_CHARS = 10_000
MAX_NOTE_CHARS = 2000
MAX_TAGS = 32
MAX_TAG_CHARS = 64
LIMITS = MappingProxyType({"title": MAX_TITLE_CHARS, "text": MAX_TEXT_CHARS, "reason": MAX_NOTE_CHARS, "note": MAX_NOTE_CHARS})


def _tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags):
        raise ConfigError("tags must be a list of non-empty strings")
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS for t in tags):
        raise ConfigError(f"at most {MAX_TAGS} tags of at most {MAX_TAG_CHARS} characters each")
    return sorted({t.strip().lower() for t in tags})


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty string")
    limit = LIMITS.get(what, MAX_TEXT_CHARS)
    if len(value.strip()) > limit:
        raise ConfigError(f"{what} is {len(value.strip()):,} characters; a memory's {what} takes at most {limit:,}")
    return value.strip()


def field_problems(title: Any, text: Any, tags: Any) -> list[str]:
    """Why these cannot be a memory's title, text and tags (empty: they can), each a line to act on."""
    problems = []
    for what, value in (("title", title), ("text", text)):
        try:
            _text(value, what)
        except ConfigError as e:
            problems.append(str(e))
    try:
        _tags(tags)
    except ConfigError as e:
        problems.append(str(e))
    return problems


VERSION_COLS = "memory_id, version, ts, actor, action, title, text, tags, status, provenance, note"


def _version_row(r: tuple) -> dict[str, Any]:
    return {
        "version": r[1], "ts": _iso(r[2]), "actor": r[3], "action": r[4], "title": r[5], "text": r[6],
        "tags": list(r[7]), "status": r[8], "provenance": json.loads(r[9]), "note": r[10],
    }


MEMORY_COLS = ("id, title, text, tags, status, version, proposal, targets, dream_id, "
               "created_at, created_by, updated_at, updated_by, provenance, store")


def _memory_row(r: tuple) -> dict[str, Any]:
    return {
        "id": r[0], "title": r[1], "text": r[2], "tags": list(r[3]), "status": r[4], "version": r[5],
        "proposal": r[6], "targets": list(r[7]), "dream_id": r[8], "created_at": _iso(r[9]),
        "created_by": r[10], "updated_at": _iso(r[11]), "updated_by": r[12], "provenance": json.loads(r[13]),
        "store": r[14],
    }


class MemoryStore:
    """Memories with versioned history and provenance, in the session log's database."""

    def __init__(self, log: SqlLog, settings: MemorySettings | None = None, scanner: SecretScanner | None = None):
        self.log = log
        self.settings = settings or MemorySettings()
        self.scanner = scanner or SecretScanner()  # what a memory may not hold: vault values, likely secrets
        self.embeddings = Embeddings()  # each memory's embedding, once per version (semantic.py)
        # the accepted memories of each mount set, indexed and kept current (index.py): injection and recall
        self.indexes = Indexes(lambda stores: MountIndex(stores, self._accepted_rows(stores), self._change_mark,
                                                         self._versions_since, self.embeddings, block))
        if not log.read_only:
            log.write(lambda tx: tx.execute(SCHEMA)).result()
        self._legacy: bool | None = None  # a read-only file from before stores (no `store` column): all in "default"
        # the shared stores this log mirrors read-only (memory/shared.py), each with the line that refuses a write
        self.shared: dict[str, str] = {}

    def refuse_shared(self, store: str) -> None:
        """SharedStoreReadOnly for a write to a shared store: only its mirror (shared.py) writes there."""
        if store in self.shared:
            raise SharedStoreReadOnly(self.shared[store])

    def _legacy_file(self, cur: Any) -> bool:
        if self._legacy is None:
            self._legacy = bool(self.log.read_only) and not one_row(
                cur, "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'memory_items' AND column_name = 'store'")[0]
        return self._legacy

    # -- reading ---------------------------------------------------------------

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple]:
        cur = self.log.cursor()
        try:
            # a writable log has the tables from the start (SCHEMA); a read-only one may never have held a memory
            if self.log.read_only and not one_row(cur, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'memory_items'")[0]:
                return []  # a read-only log that never held a memory
            if self._legacy_file(cur):  # read as if migrated: every memory and every dream's read in "default"
                if "memory_imports" in sql:
                    return []
                for table in ("memories", "memory_items", "dream_reads"):
                    sql = sql.replace(f"FROM {table} ", f"FROM (SELECT *, '{DEFAULT_STORE}' AS store FROM {table}) {table} ")
            return cur.execute(sql, params or []).fetchall()
        finally:
            cur.close()

    def _change_mark(self) -> tuple[int, Any, int] | None:
        """(versions, the newest version's time, redactions): what moves with every change of a memory."""
        rows = self._rows("SELECT (SELECT count(*) FROM memory_versions), (SELECT max(ts) FROM memory_versions), "
                          "(SELECT count(*) FROM memory_redactions)")
        return (rows[0][0], rows[0][1], rows[0][2]) if rows else None

    def _versions_since(self, ts: Any) -> tuple[builtins.list[tuple[str, Any]], int, int]:
        """The (memory id, ts) of the versions from `ts` on, with the version and redaction counts read with them."""
        rows = self._rows("SELECT memory_id, ts, (SELECT count(*) FROM memory_versions), (SELECT count(*) FROM "
                          "memory_redactions) FROM memory_versions WHERE ts >= ?", [ts])
        if not rows:
            return [], -1, -1  # the newest known version is gone (another file in place): the index rebuilds
        return [(r[0], r[1]) for r in rows], rows[0][2], rows[0][3]

    def _accepted_rows(self, stores: Sequence[str]) -> Any:
        def load(ids: builtins.list[str] | None) -> builtins.list[dict[str, Any]]:
            if ids is None:
                return self.list(status="accepted", store=builtins.list(stores), annotate=False)
            return [_memory_row(r) for r in self._rows(
                f"SELECT {MEMORY_COLS} FROM memories WHERE id IN ({', '.join('?' * len(ids))})", ids)] if ids else []
        return load

    def store_names(self) -> builtins.list[str]:
        """The stores that hold a memory, by name."""
        return [r[0] for r in self._rows("SELECT DISTINCT store FROM memory_items ORDER BY store")]

    def recall(self, query: str, stores: Sequence[str], limit: int) -> builtins.list[tuple[dict[str, Any], float]]:
        """The accepted memories of `stores` that match `query` (semantic.recall_rank; score > 0), the best first,
        at most `limit`, from the mount set's index."""
        index = self.indexes.of(stores)
        with index.fresh():
            return index.recall(query, limit)

    def list(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None,
             search: str | None = None, store: str | Sequence[str] | None = None,
             annotate: bool = True) -> list[dict[str, Any]]:
        """Current memories, oldest first, filtered by status, tag, dream, text and store (a name or several);
        `annotate`: with `superseded_by` and `conflicts` (what a reviewer needs; the prompt and the tools do without)."""
        where: builtins.list[str] = []
        params: builtins.list[Any] = []
        names = _store_names(store)
        if names is not None:
            if not names:
                return []
            where.append(f"store IN ({', '.join('?' * len(names))})")
            params += names
        if status:
            if status not in STATUSES:
                raise ConfigError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
            where.append("status = ?")
            params.append(status)
        if tag:
            where.append("list_contains(tags, ?)")
            params.append(tag.strip().lower())
        if dream:
            where.append("dream_id = ?")
            params.append(dream)
        if search:
            where.append("(title ILIKE ? OR text ILIKE ?)")
            params += [f"%{search}%"] * 2
        sql = f"SELECT {MEMORY_COLS} FROM memories {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY created_at, id"
        rows = [_memory_row(r) for r in self._rows(sql, params)]
        if rows and annotate:
            self._annotate(rows)
        return rows

    def _annotate(self, rows: builtins.list[dict[str, Any]]) -> None:
        """Each row gets `superseded_by` (ids) and `conflicts`: the live memories it looks contradictory to."""
        links: dict[str, builtins.list[str]] = {}
        for old, new in self._rows("SELECT memory_id, by_id FROM memory_links ORDER BY ts"):
            links.setdefault(old, []).append(new)
        live = [m for m in self._current_rows() if m["status"] in LIVE]
        found: dict[str, Any] = {}
        for name in {m["store"] for m in rows}:  # a store is a scope of its own: memories of two stores never conflict
            found.update(contradictions_among([m for m in rows if m["status"] in LIVE and m["store"] == name],
                                              [m for m in live if m["store"] == name]))
        for m in rows:
            m["superseded_by"] = links.get(m["id"], [])
            m["conflicts"] = found.get(m["id"], [])

    def _current_rows(self) -> builtins.list[dict[str, Any]]:
        return [_memory_row(r) for r in self._rows(f"SELECT {MEMORY_COLS} FROM memories ORDER BY created_at, id")]

    def links(self, memory_id: str) -> dict[str, builtins.list[dict[str, Any]]]:
        """What a memory replaced (`supersedes`) and what replaced it (`superseded_by`), each link with who and when."""
        out: dict[str, builtins.list[dict[str, Any]]] = {"supersedes": [], "superseded_by": []}
        for old, new, ts, actor, kind in self._rows(
                "SELECT memory_id, by_id, ts, actor, kind FROM memory_links WHERE memory_id = ? OR by_id = ? ORDER BY ts",
                [memory_id, memory_id]):
            other = new if old == memory_id else old
            title = self._rows("SELECT title, status FROM memories WHERE id = ?", [other])
            out["superseded_by" if old == memory_id else "supersedes"].append(
                {"id": other, "title": title[0][0] if title else None, "status": title[0][1] if title else None,
                 "ts": _iso(ts), "actor": actor, "kind": kind})
        return out

    def current(self, memory_id: str) -> str:
        """The memory in effect in place of this one: follow `superseded_by` to one that nothing replaced."""
        seen = [memory_id]
        while True:
            nxt = self._rows("SELECT by_id FROM memory_links WHERE memory_id = ? ORDER BY ts DESC LIMIT 1", [seen[-1]])
            if not nxt or nxt[0][0] in seen:
                return seen[-1]
            seen.append(nxt[0][0])

    def get(self, memory_id: str) -> dict[str, Any]:
        """One memory with its whole history and redaction records; raises UnknownMemory."""
        rows = self._rows(f"SELECT {MEMORY_COLS} FROM memories WHERE id = ?", [memory_id])
        if not rows:
            raise UnknownMemory(f"no memory {memory_id!r} (list them with `workbench memories`)")
        m = _memory_row(rows[0])
        m["history"] = [_version_row(r) for r in self._rows(
            f"SELECT {VERSION_COLS} FROM memory_versions WHERE memory_id = ? ORDER BY version", [memory_id])]
        m["redactions"] = [
            {"version": r[0], "ts": _iso(r[1]), "actor": r[2], "reason": r[3], "versions": list(r[4])}
            for r in self._rows(
                "SELECT version, ts, actor, reason, versions FROM memory_redactions WHERE memory_id = ? ORDER BY ts", [memory_id])
        ]
        m.update(self.links(memory_id))
        m["current"] = self.current(memory_id)
        live = [x for x in self._current_rows() if x["status"] in LIVE and x["store"] == m["store"]]
        m["conflicts"] = contradictions(m, live) if m["status"] in LIVE else []
        m["imports"] = [
            {"id": r[0], "ts": _iso(r[1]), "actor": r[2], "source_store": r[3], "exported_at": r[4], "exported_by": r[5]}
            for r in self._rows("SELECT id, ts, actor, source_store, exported_at, exported_by FROM memory_imports "
                                "WHERE list_contains(memories, ?) ORDER BY ts", [memory_id])]
        return m

    def bookmarks(self, store: str = DEFAULT_STORE) -> dict[str, int]:
        """For each session, the last seq any finished dream into `store` has read (dreams into other stores
        read for theirs: a session read for one store is still unread for another)."""
        return dict(self._rows("SELECT session_id, max(last_seq) FROM dream_reads WHERE store = ? GROUP BY session_id",
                               [check_store(store)]))

    def dreams(self) -> builtins.list[dict[str, Any]]:
        """Dream sessions, oldest first, with how many memories each proposed."""
        out = []
        for s in self.log.sessions(kind="dream"):
            n = self._rows("SELECT count(*) FROM memory_items WHERE dream_id = ?", [s["id"]])
            done = self._rows("SELECT count(*) FROM dream_reads WHERE dream_id = ?", [s["id"]])
            out.append(dict(s, proposals=n[0][0] if n else 0, sessions_read=done[0][0] if done else 0))
        return out

    def session_events(self, session_id: str, after: int | None = None, until: int | None = None) -> builtins.list[dict[str, Any]]:
        """A slice of a session's events as JSON (what the review panels show as context)."""
        return [e.to_json() for e in self.log.events(session_id, after=after, until=until)]

    def prompt_memories(self, query: str | None = None,
                        stores: Sequence[str] = (DEFAULT_STORE,)) -> tuple[str, builtins.list[dict[str, Any]]]:
        """The memory preamble for a new session's system prompt, and what it holds (see `injection`)."""
        text, used, _, _ = self.injection(query, stores)
        return text, used

    def injection(self, query: str | None = None, stores: Sequence[str] = (DEFAULT_STORE,)
                  ) -> tuple[str, builtins.list[dict[str, Any]], int, builtins.list[dict[str, Any]]]:
        """The memory preamble for a new session's system prompt, what it holds, how many did not fit,
        and the accepted memories held back by a newer one that contradicts them.

        Accepted memories only (a superseded, retired or rejected one never), ranked by BM25
        relevance to `query` (the session's first message, else its title), then newest; each
        with its date and the sessions it came from. Under `inject_chars`, the best go first.
        Only memories of `stores` (the session's mounts) are candidates. Of two accepted memories of
        one store that contradict each other (relevance.contradiction) and that no review resolved,
        only the newer (last accepted or changed) is told: the later decision stands until a person
        supersedes or retires one of them.
        """
        index = self.indexes.of(stores)
        with index.fresh():
            if not self.settings.inject or not len(index):
                return "", [], 0, []
            held = index.held_back()
            ranked = index.ranked(query)
            shortest = index.shortest_block()
        head = ("# Memories\n\nAccepted memories from earlier sessions, reviewed by a person, most relevant first; "
                "each says when it was last accepted or changed and which sessions it came from. They may be out "
                "of date: check them against what you see.\n")
        parts, used, size, left = [head], [], len(head), 0
        for n, (e, score) in enumerate(ranked):
            if size + len(e.block) > self.settings.inject_chars:
                left += 1
                if self.settings.inject_chars - size < shortest:  # nothing else fits: the rest are counted, not tried
                    left += len(ranked) - n - 1
                    break
                continue  # the rest still fit if they are short; what was left out is counted in the event
            m = e.memory
            parts.append(e.block)
            size += len(e.block)
            used.append({"id": m["id"], "version": m["version"], "title": m["title"], "updated_at": m["updated_at"],
                         "sessions": sessions_of(m), "score": round(score, 4), "why": "relevant" if score > 0 else "recent"})
        if not used:
            return "", [], left, builtins.list(held.values())
        return "".join(parts).strip(), used, left, builtins.list(held.values())

    # -- writing (each on the log's writer thread, in one transaction) ------------

    def create(self, *, title: str, text: str, actor: str, provenance: builtins.list[dict[str, Any]],
               tags: builtins.list[str] | None = None, status: str = "proposed", proposal: str = "create",
               targets: builtins.list[str] | None = None, dream_id: str | None = None, note: str | None = None,
               store: str = DEFAULT_STORE) -> str:
        """Add a memory to `store` (a proposal unless status says otherwise); returns its id."""
        return self.log.write(lambda tx: self.tx_create(
            tx, title=title, text=text, actor=actor, provenance=provenance, tags=tags, status=status,
            proposal=proposal, targets=targets, dream_id=dream_id, note=note, store=store)).result()

    def tx_create(self, tx: Any, *, title: str, text: str, actor: str, provenance: builtins.list[dict[str, Any]],
                  tags: builtins.list[str] | None = None, status: str = "proposed", proposal: str = "create",
                  targets: builtins.list[str] | None = None, dream_id: str | None = None, note: str | None = None,
                  memory_id: str | None = None, store: str = DEFAULT_STORE) -> str:
        """`create` inside a transaction the caller owns (a dream commits many at once)."""
        check_actor(actor)
        self.refuse_shared(check_store(store))
        if proposal not in PROPOSALS or status not in STATUSES:
            raise ConfigError(f"bad proposal {proposal!r} or status {status!r}")
        for target in targets or []:  # a store holds its whole chain: nothing in it replaces a memory of another store
            other = self._current(tx, target)["store"]
            if other != store:
                raise MemoryConflict(f"memory {target} is in store {other!r}, not {store!r}: a memory replaces only "
                                     "memories of its own store")
        memory_id = memory_id or "m" + uuid.uuid4().hex[:10]
        tx.execute("INSERT INTO memory_items (id, created_at, created_by, proposal, targets, dream_id, store) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)", [memory_id, _now(), actor, proposal, list(targets or []), dream_id, store])
        action = "propose" if status == "proposed" else ("merge" if proposal == "merge" else "create")
        self._version(tx, memory_id, 1, actor, action, _text(title, "title"), _text(text, "text"),
                      _tags(tags), status, provenance, note)
        return memory_id

    def _version(self, tx: Any, memory_id: str, version: int, actor: str, action: str, title: str, text: str,
                 tags: builtins.list[str], status: str, provenance: builtins.list[dict[str, Any]], note: str | None) -> None:
        tx.execute(f"INSERT INTO memory_versions ({VERSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [memory_id, version, _now(), actor, action, title, text, tags, status, json.dumps(provenance), note])

    def tx_current(self, tx: Any, memory_id: str) -> dict[str, Any]:
        """A memory as it is inside the caller's transaction (UnknownMemory when there is none)."""
        return self._current(tx, memory_id)

    def tx_change(self, tx: Any, m: dict[str, Any], actor: str, action: str, *, note: str | None = None,
                  **new: Any) -> dict[str, Any]:
        """Append the next version of memory m (as `tx_current` read it), some fields changed, in the caller's
        transaction; the memory as it is then."""
        check_actor(actor)
        return self._change(tx, m, actor, action, note=note, **new)

    def _current(self, tx: Any, memory_id: str) -> dict[str, Any]:
        row = tx.execute(f"SELECT {MEMORY_COLS} FROM memories WHERE id = ?", [memory_id]).fetchone()
        if row is None:
            raise UnknownMemory(f"no memory {memory_id!r} (list them with `workbench memories`)")
        return _memory_row(row)

    def _change(self, tx: Any, m: dict[str, Any], actor: str, action: str, *, note: str | None = None, **new: Any) -> dict[str, Any]:
        """Append the next version of memory m, with some fields changed."""
        self.refuse_shared(m["store"])
        v = {k: m[k] for k in ("title", "text", "tags", "status", "provenance")}
        v.update({k: x for k, x in new.items() if x is not None})
        self._version(tx, m["id"], m["version"] + 1, actor, action, v["title"], v["text"], v["tags"],
                      v["status"], v["provenance"], note)
        return self._current(tx, m["id"])

    def review(self, memory_id: str, action: str, actor: str, **kw: Any) -> dict[str, Any]:
        """Apply one review action (accept, reject, edit, merge, retire, redact); returns the memory."""
        if action not in REVIEW_ACTIONS:
            raise ConfigError(f"unknown review action {action!r}; one of {', '.join(REVIEW_ACTIONS)}")
        check_actor(actor)
        unknown = set(kw) - {"title", "text", "tags", "note", "reason", "with", "by", "allow_secret"}
        if unknown:
            raise ConfigError(f"unknown fields for {action}: {', '.join(sorted(unknown))}")
        if self.shared:  # before anything else is checked: no review of a shared store's memory is taken here
            rows = self._rows("SELECT store FROM memory_items WHERE id = ?", [memory_id])
            if rows:
                self.refuse_shared(rows[0][0])
        if not kw.pop("allow_secret", False):
            self.refuse_secrets(kw.get("title"), kw.get("text"))
        if action == "redact":  # the source sentences are read from committed events, before the write
            kw["sources"] = self.source_sentences(memory_id)
        result_id = self.log.write(lambda tx: getattr(self, "_" + action)(tx, memory_id, actor, **kw)).result()
        if action == "redact":
            self.log.compact()  # the old bytes of what was scrubbed must not stay in the file's free blocks
        return self.get(result_id)

    def secret_problems(self, title: Any, text: Any) -> builtins.list[str]:
        """Why this title and text may not be stored (a vault value, a likely secret), one line each; empty: none."""
        return self.scanner.problems_of((what, value) for what, value in (("title", title), ("text", text))
                                        if isinstance(value, str))

    def refuse_secrets(self, title: Any, text: Any) -> None:
        """ConfigError (a 400, a CLI error) when a person's title or text holds a secret."""
        problems = self.secret_problems(title, text)
        if problems:
            raise ConfigError("not saved: " + "; ".join(problems) + ". Remove it; if it is not a secret, "
                              'confirm with "allow_secret": true (CLI: --allow-secret)')

    def _edits(self, kw: dict[str, Any]) -> dict[str, Any]:
        return {
            "title": _text(kw["title"], "title") if kw.get("title") is not None else None,
            "text": _text(kw["text"], "text") if kw.get("text") is not None else None,
            "tags": _tags(kw["tags"]) if kw.get("tags") is not None else None,
        }

    def _edit(self, tx: Any, memory_id: str, actor: str, note: str | None = None, **kw: Any) -> str:
        m = self._current(tx, memory_id)
        edits = self._edits(kw)
        if all(edits[k] is None or edits[k] == m[k] for k in edits):
            raise ConfigError("an edit needs a new title, text or tags")
        if m["status"] in ("superseded", "retired", "rejected", "redacted"):
            raise MemoryConflict(f"memory {memory_id} is {m['status']}; edit the memory that replaced it, or propose a new one")
        self._change(tx, m, actor, "edit", note=note, **edits)
        return memory_id

    def _accept(self, tx: Any, memory_id: str, actor: str, note: str | None = None, **kw: Any) -> str:
        m = self._current(tx, memory_id)
        if m["status"] not in ("proposed", "rejected"):
            raise MemoryConflict(f"memory {memory_id} is {m['status']}; only proposed (or rejected) memories can be accepted")
        edits = self._edits(kw)
        if any(edits[k] is not None and edits[k] != m[k] for k in edits):
            m = self._change(tx, m, actor, "edit", note="edited before accepting", **edits)
        for target in m["targets"]:
            t = self._current(tx, target)
            if t["status"] not in ("accepted", "proposed"):
                raise MemoryConflict(f"memory {target} is already {t['status']}; this proposal is stale, reject it")
            if m["proposal"] == "retire":
                self._change(tx, t, actor, "retire", status="retired", note=f"retired by proposal {memory_id}")
            else:
                self._change(tx, t, actor, "supersede", status="superseded", note=f"superseded by {memory_id}")
                self._link(tx, target, memory_id, actor, m["proposal"])
        # a carried-out retire proposal is closed as retired, so `accepted` always means "in the prompt"
        status = "retired" if m["proposal"] == "retire" else "accepted"
        self._change(tx, m, actor, "accept", status=status, note=note)
        return memory_id

    def _reject(self, tx: Any, memory_id: str, actor: str, note: str | None = None, reason: str | None = None) -> str:
        m = self._current(tx, memory_id)
        if m["status"] != "proposed":
            raise MemoryConflict(f"memory {memory_id} is {m['status']}; only proposed memories can be rejected (retire an accepted one)")
        self._change(tx, m, actor, "reject", status="rejected", note=note or reason)
        return memory_id

    def _retire(self, tx: Any, memory_id: str, actor: str, note: str | None = None, reason: str | None = None) -> str:
        m = self._current(tx, memory_id)
        if m["status"] not in ("accepted", "proposed"):
            raise MemoryConflict(f"memory {memory_id} is {m['status']} already")
        self._change(tx, m, actor, "retire", status="retired", note=note or reason)
        return memory_id

    def _merge(self, tx: Any, memory_id: str, actor: str, note: str | None = None, **kw: Any) -> str:
        others = kw.get("with") or []
        if not isinstance(others, list) or not others or memory_id in others:
            raise ConfigError('a merge needs "with": [other memory ids] besides this one')
        parts = [self._current(tx, i) for i in [memory_id, *others]]
        for p in parts:
            if p["status"] not in ("accepted", "proposed"):
                raise MemoryConflict(f"memory {p['id']} is {p['status']}; only accepted or proposed memories can be merged")
            if p["store"] != parts[0]["store"]:
                raise MemoryConflict(f"memory {p['id']} is in store {p['store']!r}, {memory_id} in {parts[0]['store']!r}: "
                                     "only memories of one store can be merged")
        edits = self._edits(kw)
        provenance = [c for p in parts for c in p["provenance"]]
        new_id = self.tx_create(
            tx, title=edits["title"] or parts[0]["title"], text=edits["text"] or "\n\n".join(p["text"] for p in parts),
            tags=edits["tags"] if edits["tags"] is not None else sorted({t for p in parts for t in p["tags"]}),
            actor=actor, provenance=provenance, status="accepted", proposal="merge",
            targets=[p["id"] for p in parts], note=note, store=parts[0]["store"])
        for p in parts:
            self._change(tx, p, actor, "merge", status="superseded", note=f"merged into {new_id}")
            self._link(tx, p["id"], new_id, actor, "merge")
        return new_id

    def _link(self, tx: Any, old: str, new: str, actor: str, kind: str) -> None:
        """Record that memory `new` replaced memory `old` (the chain a reviewer sees)."""
        tx.execute("INSERT OR REPLACE INTO memory_links VALUES (?, ?, ?, ?, ?)", [old, new, _now(), actor, kind])

    def _supersede(self, tx: Any, memory_id: str, actor: str, by: str | None = None, note: str | None = None,
                   reason: str | None = None) -> str:
        """Memory `by` (accepted) replaces this one (accepted or proposed): this one is no longer injected."""
        if not isinstance(by, str) or not by or by == memory_id:
            raise ConfigError('a supersede needs "by": the id of the newer, accepted memory that replaces this one')
        m, newer = self._current(tx, memory_id), self._current(tx, by)
        if m["status"] not in LIVE:
            raise MemoryConflict(f"memory {memory_id} is {m['status']} already")
        if newer["status"] != "accepted":
            raise MemoryConflict(f"memory {by} is {newer['status']}; only an accepted memory can supersede another "
                                 "(accept it first)")
        if newer["store"] != m["store"]:
            raise MemoryConflict(f"memory {by} is in store {newer['store']!r}, {memory_id} in {m['store']!r}: "
                                 "a memory is superseded only by one of its own store")
        self._change(tx, m, actor, "supersede", status="superseded", note=note or reason or f"superseded by {by}")
        self._link(tx, memory_id, by, actor, "supersede")
        return memory_id

    def source_sentences(self, memory_id: str) -> builtins.list[str]:
        """The sentences of the events a memory's versions cite that its quotes come from (sources.py): what a
        redaction removes from the log besides the memory's own words, however the memory reworded them."""
        cited = []
        for (prov,) in self._rows("SELECT provenance FROM memory_versions WHERE memory_id = ?", [memory_id]):
            cited += [c for c in json.loads(prov) if isinstance(c, dict)]
        found = cited_sentences(cited, lambda sid, seq: [e.payload for e in self.log.events(sid, after=seq - 1, until=seq)])
        sessions = sorted({c["session_id"] for c in cited if isinstance(c.get("session_id"), str)})[:MAX_SOURCE_SESSIONS]
        if not found or not sessions:
            return found
        # other memories from the same sessions may copy part of a source sentence (a title cut short)
        where = " OR ".join(["contains(provenance::VARCHAR, ?)"] * len(sessions))
        texts = [t for title, text in self._rows(f"SELECT title, text FROM memory_versions WHERE {where}",
                                                 [json.dumps(s) for s in sessions]) for t in (title, text)]
        return found + fragments(texts, found)

    def _redact(self, tx: Any, memory_id: str, actor: str, reason: str | None = None, note: str | None = None,
                title: str | None = None, sources: Sequence[str] = (), **_: Any) -> str:
        m = self._current(tx, memory_id)
        reason = _text(reason or note, "reason")
        new_title = _text(title, "title") if title is not None else REDACTED
        rows = tx.execute("SELECT version, title, text, provenance, note FROM memory_versions WHERE memory_id = ? ORDER BY version",
                          [memory_id]).fetchall()
        versions = [r[0] for r in rows]
        targets = sorted({*self._scrub_targets(rows), *(t for t in sources if len(t) >= MIN_SCRUB and t != REDACTED)},
                         key=lambda t: (-len(t), t))
        # the memory itself: no version keeps its title, text or the quotes copied from the source events
        tx.execute("UPDATE memory_versions SET text = ?, title = ? WHERE memory_id = ?", [REDACTED, new_title, memory_id])
        for version, prov in tx.execute("SELECT version, provenance FROM memory_versions WHERE memory_id = ?", [memory_id]).fetchall():
            blanked = [dict(c, quote=REDACTED) if "quote" in c else c for c in json.loads(prov)]
            tx.execute("UPDATE memory_versions SET provenance = ? WHERE memory_id = ? AND version = ?",
                       [json.dumps(blanked), memory_id, version])
        # other memories with a copy (a merge joins texts), and every copy in the session log
        self._scrub_memories(tx, targets)
        touched = tx.scrub(targets, REDACTED)
        reason = scrub_text(reason, targets, REDACTED)
        m = self._current(tx, memory_id)
        self._change(tx, m, actor, "redact", status="redacted", note=reason)
        tx.execute("INSERT INTO memory_redactions VALUES (?, ?, ?, ?, ?, ?)",
                   [memory_id, m["version"] + 1, _now(), actor, reason, versions])
        for sid, seqs in touched.items():  # the tombstones: who, when (the event's ts), why, and what changed
            tx.append(sid, "redacted", {"memory_id": memory_id, "actor": actor, "reason": reason, "seqs": seqs,
                                        "replacement": REDACTED})
        return memory_id

    def _scrub_targets(self, rows: builtins.list[tuple]) -> builtins.list[str]:
        """Every text of a memory's versions that a redaction removes from the log: titles, texts and their
        longer lines, and the likely secrets in them and in its quotes (a token is also in the events the
        memory came from; a quote as a whole is not removed: it may be a common line of code)."""
        found: set[str] = set()
        for _, title, text, prov, _note in rows:
            quotes = [c["quote"] for c in json.loads(prov) if isinstance(c.get("quote"), str)]
            for t in (title, text):
                found.add(t.strip())
                found.update(line.strip() for line in t.splitlines() if len(line.strip()) >= MIN_SCRUB_LINE)
            for t in (title, text, *quotes):
                found.update(self.scanner.values(t))
        return sorted((t for t in found if len(t) >= MIN_SCRUB and t != REDACTED), key=lambda t: (-len(t), t))

    def _scrub_memories(self, tx: Any, targets: builtins.list[str]) -> None:
        if not targets:
            return
        where = " OR ".join(["contains(title, ?) OR contains(text, ?) OR contains(coalesce(note, ''), ?) "
                             "OR contains(provenance::VARCHAR, ?)"] * len(targets))
        params = [p for t in targets for p in (t, t, t, json.dumps(t)[1:-1])]
        rows = tx.execute(f"SELECT memory_id, version, title, text, note, provenance FROM memory_versions WHERE {where}",
                          params).fetchall()
        for mid, version, title, text, note, prov in rows:
            quotes = [dict(c, quote=scrub_text(c["quote"], targets, REDACTED)) if isinstance(c.get("quote"), str) else c
                      for c in json.loads(prov)]
            tx.execute("UPDATE memory_versions SET title = ?, text = ?, note = ?, provenance = ? WHERE memory_id = ? AND version = ?",
                       [scrub_text(title, targets, REDACTED) or REDACTED, scrub_text(text, targets, REDACTED) or REDACTED,
                        None if note is None else scrub_text(note, targets, REDACTED), json.dumps(quotes), mid, version])
