"""A memory store as a JSON file and back: every memory with all its versions, actors, timestamps,
statuses, provenance, redaction records and links (docs/memory.md, "Export and import").

The file is hostile until checked: `parse_export` reads bytes (at most MAX_FILE_BYTES of UTF-8
JSON, no NaN, no duplicate keys, no lone surrogates or NUL) and checks every field, naming the
first problem by its path (`memories[3].versions[1].title`). `import_store` writes everything or
nothing, in one transaction: a memory whose id the target store holds already is skipped and
reported; an id another store holds refuses the file. A redacted memory comes in redacted: no
version of it keeps a title, text or quote, whatever the file says.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from ..plugins.errors import ConfigError, MemoryConflict, UnknownMemory
from ..plugins.log import is_session_id
from ..plugins.settings import NumberRefused, parse_float, parse_int
from .store import (
    ACTOR_GRAMMAR,
    MAX_NOTE_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TEXT_CHARS,
    MAX_TITLE_CHARS,
    PROPOSALS,
    REDACTED,
    STATUSES,
    MemoryStore,
    _iso,
    _now,
    check_actor,
    check_store,
    is_actor,
)

FORMAT = "workbench-memory-store"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 16 << 20  # an export of 1,000 memories of 10 versions each is a few MB
MAX_MEMORIES = 10_000
MAX_VERSIONS = 1000  # of one memory
MAX_CITATIONS = 1000  # of one version
MAX_ID_CHARS = 200  # a session or dream id in provenance (log.SESSION_ID)
MAX_QUOTE_CHARS = 10_000
MEMORY_ID = re.compile(r"^m[0-9a-f]{10}$")  # as the store makes them: "m" and 10 hex digits
ACTIONS = ("propose", "create", "edit", "accept", "reject", "supersede", "merge", "retire", "redact")
LINK_KINDS = ("supersede", "merge", "edit", "create")
TOP_KEYS = frozenset({"format", "format_version", "store", "exported_at", "exported_by", "memories", "links"})
MEMORY_KEYS = frozenset({"id", "created_at", "created_by", "proposal", "targets", "dream_id", "versions", "redactions"})
VERSION_KEYS = frozenset({"version", "ts", "actor", "action", "title", "text", "tags", "status", "provenance", "note"})
REDACTION_KEYS = frozenset({"version", "ts", "actor", "reason", "versions"})
LINK_KEYS = frozenset({"memory_id", "by_id", "ts", "actor", "kind"})
CITATION_KEYS = frozenset({"session_id", "seq", "quote"})


# -- export ---------------------------------------------------------------------------------


def export_store(store: MemoryStore, name: str, actor: str) -> dict[str, Any]:
    """Every memory of store `name` with its whole history, as the export format; UnknownMemory when it holds none."""
    check_store(name)
    ids = [r[0] for r in store._rows("SELECT id FROM memory_items WHERE store = ? ORDER BY created_at, id", [name])]
    if not ids:
        known = [r[0] for r in store._rows("SELECT DISTINCT store FROM memory_items ORDER BY store")]
        raise UnknownMemory(f"no memory is in store {name!r}; stores with memories: {', '.join(known) or 'none'}")
    memories = []
    for mid in ids:
        m = store.get(mid)
        memories.append({
            "id": m["id"], "created_at": m["created_at"], "created_by": m["created_by"], "proposal": m["proposal"],
            "targets": m["targets"], "dream_id": m["dream_id"],
            "versions": [{k: v[k] for k in ("version", "ts", "actor", "action", "title", "text", "tags", "status",
                                             "provenance", "note")} for v in m["history"]],
            "redactions": m["redactions"],
        })
    links = [{"memory_id": r[0], "by_id": r[1], "ts": _iso(r[2]), "actor": r[3], "kind": r[4]} for r in store._rows(
        "SELECT memory_id, by_id, ts, actor, kind FROM memory_links WHERE memory_id IN (SELECT id FROM memory_items WHERE store = ?) "
        "AND by_id IN (SELECT id FROM memory_items WHERE store = ?) ORDER BY ts, memory_id, by_id", [name, name])]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "store": name, "exported_at": _iso(_now()),
            "exported_by": actor, "memories": memories, "links": links}


# -- reading a file ---------------------------------------------------------------------------


class _Bad(ValueError):
    """A problem of the file, at a path."""


def _refuse(path: str, why: str) -> _Bad:
    return _Bad(f"{path}: {why}" if path else why)


def _no_constants(name: str) -> Any:
    raise _Bad(f"{name} is not a JSON number (the file must be strict JSON)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Bad(f"the key {k[:40]!r} appears twice in one object")
        out[k] = v
    return out


def parse_export(data: bytes) -> dict[str, Any]:
    """The export in `data`, checked field by field; ConfigError names the first problem and where it is."""
    if not isinstance(data, (bytes, bytearray)):
        raise ConfigError("an export is read as bytes")
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"the file is {len(data):,} bytes; an export takes at most {MAX_FILE_BYTES:,}")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not an export: the file is not UTF-8 (byte {e.start:,})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constants, parse_int=parse_int, parse_float=parse_float,
                         object_pairs_hook=_no_duplicates)
    except (_Bad, NumberRefused) as e:  # a number is bounded before it is parsed: no plain ValueError (a 500)
        raise ConfigError(f"not an export: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"not an export: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise ConfigError("not an export: the JSON is nested too deeply") from None
    try:
        return _check_doc(doc)
    except _Bad as e:
        raise ConfigError(f"not a valid export: {e}") from None


def _obj(value: Any, path: str, keys: frozenset[str], required: frozenset[str] | set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _refuse(path, f"must be an object, not {_kind(value)}")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise _refuse(path, f"unknown key {unknown[0][:40]!r} (known: {', '.join(sorted(keys))})")
    missing = sorted(required - set(value))
    if missing:
        raise _refuse(path, f"missing {missing[0]!r}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def _str(value: Any, path: str, most: int, *, blank: bool = False, nullable: bool = False) -> Any:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise _refuse(path, f"must be a string, not {_kind(value)}")
    if not blank and not value.strip():
        raise _refuse(path, "must not be empty")
    if len(value) > most:
        raise _refuse(path, f"is {len(value):,} characters; at most {most:,}")
    if "\x00" in value:
        raise _refuse(path, "holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(path, "holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
    return value


def _int(value: Any, path: str, lo: int = 0, hi: int = 2**62) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _refuse(path, f"must be a whole number from {lo:,} to {hi:,}")
    return value


def _list(value: Any, path: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise _refuse(path, f"must be a list, not {_kind(value)}")
    if len(value) > most:
        raise _refuse(path, f"has {len(value):,} items; at most {most:,}")
    return value


def _ts(value: Any, path: str) -> datetime:
    s = _str(value, path, 64)
    try:
        ts = datetime.fromisoformat(s)
    except ValueError:
        raise _refuse(path, f"{s[:40]!r} is not an ISO 8601 time") from None
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo else ts


def _actor(value: Any, path: str) -> str:
    s = _str(value, path, 260)
    if not is_actor(s):
        raise _refuse(path, f"{s[:40]!r} is not an actor: {ACTOR_GRAMMAR}")
    return s


def _session_id(value: Any, path: str, *, nullable: bool = False) -> Any:
    s = _str(value, path, MAX_ID_CHARS, nullable=nullable)
    if s is not None and not is_session_id(s):
        raise _refuse(path, f"{s[:40]!r} is not a session id (1 to 200 letters, digits and . _ : @ -, "
                            "starting with a letter or digit)")
    return s


def _choice(value: Any, path: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        shown = repr(value[:40]) if isinstance(value, str) else _kind(value)
        raise _refuse(path, f"is {shown}; one of {', '.join(choices)}")
    return str(value)


def _memory_id(value: Any, path: str) -> str:
    s = _str(value, path, 20)
    if not MEMORY_ID.match(s):
        raise _refuse(path, f"{s!r} is not a memory id ('m' and 10 hex digits)")
    return s


def _check_doc(doc: Any) -> dict[str, Any]:
    _obj(doc, "", TOP_KEYS, TOP_KEYS - {"exported_by", "exported_at"})
    if doc["format"] != FORMAT:
        shown = repr(doc["format"][:60]) if isinstance(doc["format"], str) else _kind(doc["format"])
        raise _refuse("format", f"is {shown}, not {FORMAT!r}: this is not a workbench memory store export")
    if doc["format_version"] != FORMAT_VERSION or isinstance(doc["format_version"], bool):
        shown = str(doc["format_version"])[:20] if not isinstance(doc["format_version"], (dict, list)) else _kind(doc["format_version"])
        raise _refuse("format_version", f"is {shown}; this workbench reads format version {FORMAT_VERSION}")
    try:
        source = check_store(doc["store"])
    except ConfigError as e:
        raise _refuse("store", str(e)) from None
    exported_at = _str(doc.get("exported_at"), "exported_at", 64, nullable=True)
    if exported_at is not None:
        _ts(exported_at, "exported_at")
    exported_by = _actor(doc["exported_by"], "exported_by") if doc.get("exported_by") is not None else None
    memories = [_check_memory(m, f"memories[{i}]") for i, m in enumerate(_list(doc["memories"], "memories", MAX_MEMORIES))]
    seen: dict[str, int] = {}
    for i, m in enumerate(memories):
        if m["id"] in seen:
            raise _refuse(f"memories[{i}].id", f"{m['id']} is also memories[{seen[m['id']]}].id; each memory once")
        seen[m["id"]] = i
    for i, m in enumerate(memories):
        for j, t in enumerate(m["targets"]):
            if t not in seen or t == m["id"]:
                raise _refuse(f"memories[{i}].targets[{j}]", f"{t} is not another memory of the file")
    links = []
    for i, link in enumerate(_list(doc["links"], "links", MAX_MEMORIES * 4)):
        path = f"links[{i}]"
        _obj(link, path, LINK_KEYS, LINK_KEYS)
        old, new = _memory_id(link["memory_id"], f"{path}.memory_id"), _memory_id(link["by_id"], f"{path}.by_id")
        for end, key in ((old, "memory_id"), (new, "by_id")):
            if end not in seen:
                raise _refuse(f"{path}.{key}", f"{end} is not a memory of the file")
        if old == new:
            raise _refuse(path, "a memory does not replace itself")
        links.append({"memory_id": old, "by_id": new, "ts": _ts(link["ts"], f"{path}.ts"),
                      "actor": _actor(link["actor"], f"{path}.actor"), "kind": _choice(link["kind"], f"{path}.kind", LINK_KINDS)})
    pairs = [(x["memory_id"], x["by_id"]) for x in links]
    if len(set(pairs)) != len(pairs):
        raise _refuse("links", "a link appears twice")
    return {"store": source, "exported_at": exported_at, "exported_by": exported_by, "memories": memories, "links": links}


def _check_memory(m: Any, path: str) -> dict[str, Any]:
    _obj(m, path, MEMORY_KEYS, MEMORY_KEYS - {"redactions", "dream_id"})
    out = {
        "id": _memory_id(m["id"], f"{path}.id"),
        "created_at": _ts(m["created_at"], f"{path}.created_at"),
        "created_by": _actor(m["created_by"], f"{path}.created_by"),
        "proposal": _choice(m["proposal"], f"{path}.proposal", PROPOSALS),
        "targets": [_memory_id(t, f"{path}.targets[{j}]") for j, t in enumerate(_list(m["targets"], f"{path}.targets", 100))],
        "dream_id": _session_id(m.get("dream_id"), f"{path}.dream_id", nullable=True),
    }
    versions = _list(m["versions"], f"{path}.versions", MAX_VERSIONS)
    if not versions:
        raise _refuse(f"{path}.versions", "must hold at least one version")
    out["versions"] = [_check_version(v, f"{path}.versions[{j}]", j + 1) for j, v in enumerate(versions)]
    out["redactions"] = [_check_redaction(r, f"{path}.redactions[{j}]", len(versions))
                         for j, r in enumerate(_list(m.get("redactions") or [], f"{path}.redactions", MAX_VERSIONS))]
    statuses = [v["status"] for v in out["versions"]]
    if "redacted" in statuses or out["redactions"]:
        if statuses[-1] != "redacted" or not out["redactions"]:
            raise _refuse(path, "a redacted memory ends with its redaction (a version with status redacted and a "
                                "redaction record); nothing changes it afterwards")
        _redact(out)
    return out


def _check_version(v: Any, path: str, number: int) -> dict[str, Any]:
    _obj(v, path, VERSION_KEYS, VERSION_KEYS - {"note"})
    if _int(v["version"], f"{path}.version", 1, MAX_VERSIONS) != number:
        raise _refuse(f"{path}.version", f"is {v['version']}; versions are numbered 1, 2, ... in order (expected {number})")
    tags = _list(v["tags"], f"{path}.tags", MAX_TAGS)
    citations = _list(v["provenance"], f"{path}.provenance", MAX_CITATIONS)
    return {
        "version": number, "ts": _ts(v["ts"], f"{path}.ts"), "actor": _actor(v["actor"], f"{path}.actor"),
        "action": _choice(v["action"], f"{path}.action", ACTIONS),
        "title": _str(v["title"], f"{path}.title", MAX_TITLE_CHARS).strip(),
        "text": _str(v["text"], f"{path}.text", MAX_TEXT_CHARS).strip(),
        "tags": sorted({_str(t, f"{path}.tags[{j}]", MAX_TAG_CHARS).strip().lower() for j, t in enumerate(tags)}),
        "status": _choice(v["status"], f"{path}.status", STATUSES),
        "provenance": [_check_citation(c, f"{path}.provenance[{j}]") for j, c in enumerate(citations)],
        "note": _str(v.get("note"), f"{path}.note", MAX_NOTE_CHARS, blank=True, nullable=True),
    }


def _check_citation(c: Any, path: str) -> dict[str, Any]:
    _obj(c, path, CITATION_KEYS, {"session_id", "seq"})
    out: dict[str, Any] = {"session_id": _session_id(c["session_id"], f"{path}.session_id"),
                           "seq": _int(c["seq"], f"{path}.seq")}
    if "quote" in c:
        out["quote"] = _str(c["quote"], f"{path}.quote", MAX_QUOTE_CHARS, blank=True)
    return out


def _check_redaction(r: Any, path: str, versions: int) -> dict[str, Any]:
    _obj(r, path, REDACTION_KEYS, REDACTION_KEYS)
    return {"version": _int(r["version"], f"{path}.version", 1, versions), "ts": _ts(r["ts"], f"{path}.ts"),
            "actor": _actor(r["actor"], f"{path}.actor"), "reason": _str(r["reason"], f"{path}.reason", MAX_NOTE_CHARS),
            "versions": [_int(n, f"{path}.versions[{j}]", 1, versions)
                         for j, n in enumerate(_list(r["versions"], f"{path}.versions", MAX_VERSIONS))]}


def _redact(m: dict[str, Any]) -> None:
    """A redacted memory's versions keep no title, text or quote (the title its redaction set, else [redacted])."""
    title = m["versions"][-1]["title"]
    for v in m["versions"]:
        v["title"], v["text"] = title, REDACTED
        v["provenance"] = [dict(c, quote=REDACTED) if "quote" in c else c for c in v["provenance"]]


# -- import ---------------------------------------------------------------------------------------


def shown_fields(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, text) of every field of a checked export that a prompt, a panel or a listing may show: each goes
    through the secret guard (ids and times have strict formats besides; a tag list is one field)."""
    if doc["exported_by"] is not None:
        yield "exported_by", doc["exported_by"]
    for i, m in enumerate(doc["memories"]):
        at = f"memories[{i}]"
        yield f"{at}.created_by", m["created_by"]
        if m["dream_id"] is not None:
            yield f"{at}.dream_id", m["dream_id"]
        for j, v in enumerate(m["versions"]):
            vat = f"{at}.versions[{j}]"
            yield from ((f"{vat}.{k}", v[k]) for k in ("actor", "title", "text") if v[k])
            if v["tags"]:
                yield f"{vat}.tags", "\n".join(v["tags"])
            if v["note"]:
                yield f"{vat}.note", v["note"]
            for c, cite in enumerate(v["provenance"]):
                yield f"{vat}.provenance[{c}].session_id", cite["session_id"]
                if cite.get("quote"):
                    yield f"{vat}.provenance[{c}].quote", cite["quote"]
        for r, red in enumerate(m["redactions"]):
            yield f"{at}.redactions[{r}].actor", red["actor"]
            yield f"{at}.redactions[{r}].reason", red["reason"]
    for i, link in enumerate(doc["links"]):
        yield f"links[{i}].actor", link["actor"]


def import_store(store: MemoryStore, data: bytes, actor: str, into: str | None = None,
                 allow_secret: bool = False, review: bool = False) -> dict[str, Any]:
    """Import an export into store `into` (default: the store it was exported from), all or nothing.

    A memory whose id the target store holds is skipped (listed in `skipped`); an id another store
    holds refuses the whole file (MemoryConflict). A title or text that looks like a secret refuses
    it too unless `allow_secret`. With `review`, an imported memory that was accepted comes in as a
    proposal (a version of the importer's on top of its history), so no session is told it before a
    person accepts it here. The import is recorded in `memory_imports` with its actor."""
    doc = parse_export(data)
    target = check_store(into or doc["store"])
    if not allow_secret:
        problems = store.scanner.problems_of(shown_fields(doc))
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ConfigError(f"not imported: {problems[0]}{more}. Remove it from the file; if it is not a secret, "
                              "import with allow_secret (CLI: --allow-secret)")

    def write(tx: Any) -> dict[str, Any]:
        ids = [m["id"] for m in doc["memories"]]
        present = dict(tx.execute(f"SELECT id, store FROM memory_items WHERE id IN ({', '.join('?' * len(ids))})",
                                  ids).fetchall()) if ids else {}
        elsewhere = sorted(i for i, s in present.items() if s != target)
        if elsewhere:
            raise MemoryConflict(f"not imported: memory {elsewhere[0]} exists in store {present[elsewhere[0]]!r} "
                                 f"({len(elsewhere)} such id(s)); a memory is in one store: import into that store instead")
        skipped = [{"id": i, "why": f"a memory with this id is in store {target!r} already"} for i in ids if i in present]
        fresh = [m for m in doc["memories"] if m["id"] not in present]
        to_review: list[str] = []
        for m in fresh:
            _insert(tx, m, target)
            last = m["versions"][-1]
            if review and last["status"] == "accepted":
                tx.execute("INSERT INTO memory_versions (memory_id, version, ts, actor, action, title, text, tags, status, "
                           "provenance, note) VALUES (?, ?, ?, ?, 'propose', ?, ?, ?, 'proposed', ?, ?)",
                           [m["id"], last["version"] + 1, _now(), actor, last["title"], last["text"], last["tags"],
                            json.dumps(last["provenance"]),
                            f"imported from store {doc['store']!r} for review (it was accepted there)"])
                to_review.append(m["id"])
        links = _insert_links(tx, doc, {m["id"] for m in fresh})
        import_id = "i" + uuid.uuid4().hex[:10]
        tx.execute("INSERT INTO memory_imports VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [import_id, _now(), actor, target, doc["store"], doc["exported_at"], doc["exported_by"],
                    [m["id"] for m in fresh], json.dumps(skipped)])
        return {"import_id": import_id, "store": target, "source_store": doc["store"], "actor": actor,
                "imported": [m["id"] for m in fresh], "skipped": skipped, "to_review": to_review,
                "versions": sum(len(m["versions"]) for m in fresh), "links": len(links)}

    check_actor(actor)
    store.refuse_shared(target)
    return store.log.write(write).result()


def _insert(tx: Any, m: dict[str, Any], target: str) -> None:
    """One checked memory of an export, with its versions and redaction records, into store `target`."""
    tx.execute("INSERT INTO memory_items (id, created_at, created_by, proposal, targets, dream_id, store) "
               "VALUES (?, ?, ?, ?, ?, ?, ?)",
               [m["id"], m["created_at"], m["created_by"], m["proposal"], m["targets"], m["dream_id"], target])
    for v in m["versions"]:
        tx.execute("INSERT INTO memory_versions (memory_id, version, ts, actor, action, title, text, tags, status, "
                   "provenance, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [m["id"], v["version"], v["ts"], v["actor"], v["action"], v["title"], v["text"], v["tags"],
                    v["status"], json.dumps(v["provenance"]), v["note"]])
    for r in m["redactions"]:
        tx.execute("INSERT INTO memory_redactions VALUES (?, ?, ?, ?, ?, ?)",
                   [m["id"], r["version"], r["ts"], r["actor"], r["reason"], r["versions"]])


def _insert_links(tx: Any, doc: dict[str, Any], new: set[str]) -> list[dict[str, Any]]:
    links = [x for x in doc["links"] if x["memory_id"] in new and x["by_id"] in new]
    for x in links:
        tx.execute("INSERT INTO memory_links VALUES (?, ?, ?, ?, ?)", [x["memory_id"], x["by_id"], x["ts"], x["actor"], x["kind"]])
    return links


def mirror_store(store: MemoryStore, doc: dict[str, Any]) -> int:
    """Make store `doc["store"]` of this log exactly the checked export `doc` (a shared store's file), in one
    transaction: what the file no longer holds goes, what it holds comes in as it is. Returns the memories mirrored.
    MemoryConflict when an id of the file is in another store of this log (nothing is written)."""
    name = doc["store"]

    def write(tx: Any) -> int:
        ids = [m["id"] for m in doc["memories"]]
        if ids:
            other = tx.execute(f"SELECT id, store FROM memory_items WHERE store <> ? AND id IN ({', '.join('?' * len(ids))})",
                               [name, *ids]).fetchall()
            if other:
                raise MemoryConflict(f"shared store {name!r} not read: its memory {other[0][0]} is in store {other[0][1]!r} "
                                     "of this log (a memory is in one store)")
        mine = "(SELECT id FROM memory_items WHERE store = ?)"
        tx.execute(f"DELETE FROM memory_links WHERE memory_id IN {mine} OR by_id IN {mine}", [name, name])
        for table in ("memory_redactions", "memory_versions"):
            tx.execute(f"DELETE FROM {table} WHERE memory_id IN {mine}", [name])
        tx.execute("DELETE FROM memory_items WHERE store = ?", [name])
        for m in doc["memories"]:
            _insert(tx, m, name)
        _insert_links(tx, doc, set(ids))
        return len(ids)

    return store.log.write(write).result()
