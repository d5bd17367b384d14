"""The memory store: memories and their full history, in the session log's DuckDB file.

Every change is a new row in `memory_versions` naming its actor; nothing is
deleted. The one in-place change is `redact`, which blanks the text (and quotes) of every
version (a leaked secret, personal data) and records who did it, when and why.
Writes run on the log's writer thread, one transaction each; reads use a
cursor of their own.
"""

from __future__ import annotations

# MemoryStore has a method named `list`; below it, the class's annotations reach the builtin as builtins.list
import builtins
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError, MemoryConflict, UnknownMemory
from ..log import DuckDBLog
from ..log.duckdb_log import one_row

SCHEMA = """
CREATE TABLE IF NOT EXISTS memory_items (
    id         VARCHAR PRIMARY KEY,
    created_at TIMESTAMP NOT NULL,
    created_by VARCHAR NOT NULL,
    proposal   VARCHAR NOT NULL,
    targets    VARCHAR[] NOT NULL,
    dream_id   VARCHAR
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
CREATE TABLE IF NOT EXISTS dream_reads (
    dream_id   VARCHAR NOT NULL,
    session_id VARCHAR NOT NULL,
    last_seq   BIGINT NOT NULL,
    ts         TIMESTAMP NOT NULL,
    PRIMARY KEY (dream_id, session_id)
);
CREATE OR REPLACE VIEW memories AS
SELECT i.id, v.title, v.text, v.tags, v.status, v.version, i.proposal, i.targets, i.dream_id,
       i.created_at, i.created_by, v.ts AS updated_at, v.actor AS updated_by, v.provenance
FROM memory_items i JOIN memory_versions v ON v.memory_id = i.id
QUALIFY row_number() OVER (PARTITION BY i.id ORDER BY v.version DESC) = 1;
"""

STATUSES = ("proposed", "accepted", "rejected", "superseded", "retired")
PROPOSALS = ("create", "edit", "merge", "retire")
REVIEW_ACTIONS = ("accept", "reject", "edit", "merge", "retire", "redact")
REDACTED = "[redacted]"
ACTOR = re.compile(r"^(api|auto-accept|(dream|person|api):\S.{0,200})$")


@dataclass
class MemorySettings:
    """Memory and dreaming; every field is documented in docs/settings.md."""

    inject: bool = True  # put accepted memories into the system prompt of new (non-dream) sessions
    inject_chars: int = 8000  # at most this many characters of memories per system prompt
    dream_model: str = ""  # the model dreams use; empty: the default model
    dream_every: int = 0  # start a dream after this many sessions finished a turn (0: never)
    dream_max_sessions: int = 20  # at most this many sessions per dream
    auto_accept: bool = False  # accept a dream's proposals without review (actor `auto-accept`)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _iso(ts: datetime) -> str:
    return ts.replace(tzinfo=UTC).isoformat()


def check_actor(actor: str) -> str:
    """An actor is `api`, `auto-accept`, `dream:<session>`, `person:<name>` or `api:<name>`."""
    if not isinstance(actor, str) or not ACTOR.match(actor):
        raise ConfigError(f"actor {actor!r} must be 'api', 'person:<name>', 'dream:<session id>' or 'api:<name>'")
    return actor


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
               "created_at, created_by, updated_at, updated_by, provenance")


def _memory_row(r: tuple) -> dict[str, Any]:
    return {
        "id": r[0], "title": r[1], "text": r[2], "tags": list(r[3]), "status": r[4], "version": r[5],
        "proposal": r[6], "targets": list(r[7]), "dream_id": r[8], "created_at": _iso(r[9]),
        "created_by": r[10], "updated_at": _iso(r[11]), "updated_by": r[12], "provenance": json.loads(r[13]),
    }


class MemoryStore:
    """Memories with versioned history and provenance, in the session log's database."""

    def __init__(self, log: DuckDBLog, settings: MemorySettings | None = None):
        self.log = log
        self.settings = settings or MemorySettings()
        if not log.read_only:
            log.write(lambda tx: tx.execute(SCHEMA)).result()

    # -- reading ---------------------------------------------------------------

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple]:
        cur = self.log.cursor()
        try:
            if not one_row(cur, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'memory_items'")[0]:
                return []  # a read-only log that never held a memory
            return cur.execute(sql, params or []).fetchall()
        finally:
            cur.close()

    def list(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None,
             search: str | None = None) -> list[dict[str, Any]]:
        """Current memories, oldest first, filtered by status, tag, dream and text."""
        where, params = [], []
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
        return [_memory_row(r) for r in self._rows(sql, params)]

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
        return m

    def bookmarks(self) -> dict[str, int]:
        """For each session, the last seq any finished dream has read."""
        return dict(self._rows("SELECT session_id, max(last_seq) FROM dream_reads GROUP BY session_id"))

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

    def prompt_memories(self) -> tuple[str, builtins.list[dict[str, Any]]]:
        """The memory preamble for a new session's system prompt, and what it holds."""
        accepted = self.list(status="accepted")
        if not accepted or not self.settings.inject:
            return "", []
        head = ("# Memories\n\nAccepted memories from earlier sessions, reviewed by a person. "
                "They may be out of date: check them against what you see.\n")
        parts, used, size = [head], [], len(head)
        for m in accepted:
            block = f"\n## {m['title']} ({m['id']})\n{m['text']}\n"
            if size + len(block) > self.settings.inject_chars:
                continue  # the rest still fit if they are short; what was left out is visible in the event
            parts.append(block)
            size += len(block)
            used.append({"id": m["id"], "version": m["version"], "title": m["title"]})
        if not used:
            return "", []
        return "".join(parts).strip(), used

    # -- writing (each on the log's writer thread, in one transaction) ------------

    def create(self, *, title: str, text: str, actor: str, provenance: builtins.list[dict[str, Any]],
               tags: builtins.list[str] | None = None, status: str = "proposed", proposal: str = "create",
               targets: builtins.list[str] | None = None, dream_id: str | None = None, note: str | None = None) -> str:
        """Add a memory (a proposal unless status says otherwise); returns its id."""
        return self.log.write(lambda tx: self.tx_create(
            tx, title=title, text=text, actor=actor, provenance=provenance, tags=tags, status=status,
            proposal=proposal, targets=targets, dream_id=dream_id, note=note)).result()

    def tx_create(self, tx: Any, *, title: str, text: str, actor: str, provenance: builtins.list[dict[str, Any]],
                  tags: builtins.list[str] | None = None, status: str = "proposed", proposal: str = "create",
                  targets: builtins.list[str] | None = None, dream_id: str | None = None, note: str | None = None,
                  memory_id: str | None = None) -> str:
        """`create` inside a transaction the caller owns (a dream commits many at once)."""
        check_actor(actor)
        if proposal not in PROPOSALS or status not in STATUSES:
            raise ConfigError(f"bad proposal {proposal!r} or status {status!r}")
        memory_id = memory_id or "m" + uuid.uuid4().hex[:10]
        tx.execute("INSERT INTO memory_items VALUES (?, ?, ?, ?, ?, ?)",
                   [memory_id, _now(), actor, proposal, list(targets or []), dream_id])
        action = "propose" if status == "proposed" else ("merge" if proposal == "merge" else "create")
        self._version(tx, memory_id, 1, actor, action, _text(title, "title"), _text(text, "text"),
                      _tags(tags), status, provenance, note)
        return memory_id

    def _version(self, tx: Any, memory_id: str, version: int, actor: str, action: str, title: str, text: str,
                 tags: builtins.list[str], status: str, provenance: builtins.list[dict[str, Any]], note: str | None) -> None:
        tx.execute(f"INSERT INTO memory_versions ({VERSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [memory_id, version, _now(), actor, action, title, text, tags, status, json.dumps(provenance), note])

    def _current(self, tx: Any, memory_id: str) -> dict[str, Any]:
        row = tx.execute(f"SELECT {MEMORY_COLS} FROM memories WHERE id = ?", [memory_id]).fetchone()
        if row is None:
            raise UnknownMemory(f"no memory {memory_id!r} (list them with `workbench memories`)")
        return _memory_row(row)

    def _change(self, tx: Any, m: dict[str, Any], actor: str, action: str, *, note: str | None = None, **new: Any) -> dict[str, Any]:
        """Append the next version of memory m, with some fields changed."""
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
        unknown = set(kw) - {"title", "text", "tags", "note", "reason", "with"}
        if unknown:
            raise ConfigError(f"unknown fields for {action}: {', '.join(sorted(unknown))}")
        result_id = self.log.write(lambda tx: getattr(self, "_" + action)(tx, memory_id, actor, **kw)).result()
        return self.get(result_id)

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
        if m["status"] in ("superseded", "retired", "rejected"):
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
        edits = self._edits(kw)
        provenance = [c for p in parts for c in p["provenance"]]
        new_id = self.tx_create(
            tx, title=edits["title"] or parts[0]["title"], text=edits["text"] or "\n\n".join(p["text"] for p in parts),
            tags=edits["tags"] if edits["tags"] is not None else sorted({t for p in parts for t in p["tags"]}),
            actor=actor, provenance=provenance, status="accepted", proposal="merge",
            targets=[p["id"] for p in parts], note=note)
        for p in parts:
            self._change(tx, p, actor, "merge", status="superseded", note=f"merged into {new_id}")
        return new_id

    def _redact(self, tx: Any, memory_id: str, actor: str, reason: str | None = None, note: str | None = None,
                title: str | None = None, **_: Any) -> str:
        m = self._current(tx, memory_id)
        reason = _text(reason or note, "reason")
        versions = [r[0] for r in tx.execute(
            "SELECT version FROM memory_versions WHERE memory_id = ? ORDER BY version", [memory_id]).fetchall()]
        # the one in-place change: the text goes from every version; the record of the redaction stays
        tx.execute("UPDATE memory_versions SET text = ? WHERE memory_id = ?", [REDACTED, memory_id])
        # quotes copied from the source events may hold the same secret
        for version, prov in tx.execute("SELECT version, provenance FROM memory_versions WHERE memory_id = ?", [memory_id]).fetchall():
            blanked = [dict(c, quote=REDACTED) if "quote" in c else c for c in json.loads(prov)]
            tx.execute("UPDATE memory_versions SET provenance = ? WHERE memory_id = ? AND version = ?",
                       [json.dumps(blanked), memory_id, version])
        if title is not None:
            tx.execute("UPDATE memory_versions SET title = ? WHERE memory_id = ?", [_text(title, "title"), memory_id])
        m = self._current(tx, memory_id)
        self._change(tx, m, actor, "redact", note=reason)
        tx.execute("INSERT INTO memory_redactions VALUES (?, ?, ?, ?, ?, ?)",
                   [memory_id, m["version"] + 1, _now(), actor, reason, versions])
        return memory_id
