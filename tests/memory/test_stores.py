"""Memory stores: a store for every memory, the stores a session mounts (read-only or read-write),
dreams into a chosen store, and a store exported and imported as JSON with its provenance."""

from __future__ import annotations

import asyncio
import json

import duckdb
import pytest

from wbforget import call
from wbmemory import build_host

from workbench.brain.tools import ToolContext
from workbench.errors import ConfigError, MemoryConflict, UnknownMemory
from workbench.log import DuckDBLog
from workbench.memory.dream import create_dream, dream_status, list_dreams, run_dream
from workbench.memory.store import REDACTED, MemoryStore
from workbench.memory.tools import propose_edit, propose_memory, propose_retire, read_memories, recall
from workbench.memory.transfer import FORMAT, FORMAT_VERSION, MAX_FILE_BYTES, export_store, import_store

PANDAS = ("Never use pandas", "Never use pandas: the project moved to polars.")
POLARS = ("Team rule: prefer polars", "Prefer polars for dataframes; the team's notebooks assume it.")


def remember(store, title, text, name="default", status="accepted", actor="person:ann"):
    return store.create(title=title, text=text, actor=actor, provenance=[], status=status, store=name)


def ctx(log, session_id) -> ToolContext:
    return ToolContext(session_id=session_id, hands=None, log=log)


def counts(db) -> tuple:
    """What the memory tables hold, to show that a refused write left nothing behind."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("memory_items", "memory_versions", "memory_links", "memory_redactions", "memory_imports"))
    finally:
        con.close()


# -- stores in the store API ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "Team", "a b", "../etc", "-x", "_x", "x" * 41, "t\x00", "tëam", 7, None])
def test_a_store_name_is_checked_with_a_clear_error(log, bad):
    store = MemoryStore(log)
    with pytest.raises(ConfigError, match="store name .* is not valid"):
        store.create(title="t", text="x", actor="person:ann", provenance=[], store=bad)
    if bad is not None:  # list(store=None): no filter
        with pytest.raises(ConfigError, match="store name"):
            store.list(store=bad)
    assert store.list() == []


def test_memories_are_listed_by_store_and_never_cross_one(log):
    store = MemoryStore(log)
    a = remember(store, *PANDAS)
    b = remember(store, "Use pandas", "Use pandas for every dataframe.", name="team-data")
    c = remember(store, "Always use pandas", "Always use pandas for dataframes.")
    assert [m["id"] for m in store.list(store="team-data")] == [b]
    assert [m["id"] for m in store.list(store="default")] == [a, c]
    assert {m["id"] for m in store.list(store=["default", "team-data"])} == {a, b, c}
    assert store.list(store="nobody") == [] and store.get(b)["store"] == "team-data"
    # the contradiction across stores is not one: a store is a scope of its own
    listed = {m["id"]: [x["id"] for x in m["conflicts"]] for m in store.list()}
    assert listed[b] == [] and store.get(b)["conflicts"] == [] and b not in listed[a]
    assert c in listed[a] and a in [x["id"] for x in store.get(c)["conflicts"]]  # within one store it still is
    # nothing of one store replaces a memory of another
    with pytest.raises(MemoryConflict, match="only memories of one store"):
        store.review(a, "merge", "person:ann", **{"with": [b]})
    with pytest.raises(MemoryConflict, match="own store"):
        store.review(a, "supersede", "person:ann", by=b)
    with pytest.raises(MemoryConflict, match="replaces only memories of its own store"):
        store.create(title="edit", text="x", actor="person:ann", provenance=[], proposal="edit", targets=[a], store="team-data")
    assert store.get(a)["status"] == "accepted" and store.get(b)["status"] == "accepted" and len(store.list()) == 3
    merged = store.review(a, "merge", "person:ann", **{"with": [c]}, text="Never use pandas.")
    assert merged["store"] == "default"


OLD_SCHEMA = """
CREATE TABLE memory_items (id VARCHAR PRIMARY KEY, created_at TIMESTAMP NOT NULL, created_by VARCHAR NOT NULL,
    proposal VARCHAR NOT NULL, targets VARCHAR[] NOT NULL, dream_id VARCHAR);
CREATE TABLE memory_versions (memory_id VARCHAR NOT NULL, version INTEGER NOT NULL, ts TIMESTAMP NOT NULL,
    actor VARCHAR NOT NULL, action VARCHAR NOT NULL, title VARCHAR NOT NULL, text VARCHAR NOT NULL,
    tags VARCHAR[] NOT NULL, status VARCHAR NOT NULL, provenance JSON NOT NULL, note VARCHAR,
    PRIMARY KEY (memory_id, version));
CREATE TABLE memory_redactions (memory_id VARCHAR NOT NULL, version INTEGER NOT NULL, ts TIMESTAMP NOT NULL,
    actor VARCHAR NOT NULL, reason VARCHAR NOT NULL, versions INTEGER[] NOT NULL);
CREATE TABLE memory_links (memory_id VARCHAR NOT NULL, by_id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL,
    actor VARCHAR NOT NULL, kind VARCHAR NOT NULL, PRIMARY KEY (memory_id, by_id));
CREATE TABLE dream_reads (dream_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL, last_seq BIGINT NOT NULL,
    ts TIMESTAMP NOT NULL, PRIMARY KEY (dream_id, session_id));
CREATE VIEW memories AS
SELECT i.id, v.title, v.text, v.tags, v.status, v.version, i.proposal, i.targets, i.dream_id,
       i.created_at, i.created_by, v.ts AS updated_at, v.actor AS updated_by, v.provenance
FROM memory_items i JOIN memory_versions v ON v.memory_id = i.id
QUALIFY row_number() OVER (PARTITION BY i.id ORDER BY v.version DESC) = 1;
INSERT INTO memory_items VALUES ('m0123456789', TIMESTAMP '2026-11-01 10:00:00', 'person:ann', 'create', [], NULL);
INSERT INTO memory_versions VALUES ('m0123456789', 1, TIMESTAMP '2026-11-01 10:00:00', 'person:ann', 'create',
    'Never use pandas', 'Never use pandas: the project moved to polars.', [], 'accepted', '[]', NULL);
INSERT INTO dream_reads VALUES ('d1', 's1', 7, TIMESTAMP '2026-11-01 10:00:00');
"""


def test_a_database_from_before_stores_keeps_working(db_path):
    DuckDBLog(db_path).close()  # the log's own tables
    con = duckdb.connect(str(db_path))
    con.execute(OLD_SCHEMA)
    con.close()
    # read-only (what `workbench memories` opens): read as if migrated, nothing written
    ro = DuckDBLog(db_path, read_only=True)
    try:
        old = MemoryStore(ro)
        (m,) = old.list()
        assert m["id"] == "m0123456789" and m["store"] == "default" and old.list(store="default") == [m]
        assert old.get("m0123456789")["imports"] == [] and old.bookmarks() == {"s1": 7} and old.bookmarks("team") == {}
        assert old.injection("pandas", ["default"])[1][0]["id"] == "m0123456789"
    finally:
        ro.close()
    con = duckdb.connect(str(db_path), read_only=True)
    assert "store" not in [r[0] for r in con.execute("DESCRIBE memory_items").fetchall()]
    con.close()
    # writable: migrated in place; its memories and its dreams' reads are in "default"
    log = DuckDBLog(db_path)
    try:
        store = MemoryStore(log)
        assert [m["store"] for m in store.list()] == ["default"] and store.bookmarks() == {"s1": 7}
        new = remember(store, *POLARS, name="team")
        assert [m["id"] for m in store.list(store="team")] == [new]
        assert store.review("m0123456789", "retire", "person:ann", note="old")["status"] == "retired"
    finally:
        log.close()


# -- mounts -------------------------------------------------------------------------------------------


def test_a_session_sees_only_the_stores_it_mounts(brain, store):
    default = remember(store, *PANDAS)
    team = remember(store, *POLARS, name="team")
    proposed = remember(store, "Team proposal about polars", "polars again", name="team", status="proposed")

    plain = brain.create_session(title="dataframes with polars or pandas", model="scripted")["id"]
    both = brain.create_session(title="dataframes with polars or pandas", model="scripted", config={
        "memory": {"stores": [{"name": "team", "access": "read_only"}, "default"]}})["id"]
    team_only = brain.create_session(title="dataframes with polars or pandas", model="scripted", config={
        "memory": {"stores": [{"name": "team", "access": "read_only"}]}})["id"]
    nothing = brain.create_session(title="dataframes", model="scripted", config={"memory": {"stores": ["empty"]}})["id"]

    def injected(sid):
        found = store.log.events(sid, types=["memories_injected"])
        return found[0].payload if found else None

    # say nothing: "default", read-write, as before stores
    assert [m["id"] for m in injected(plain)["memories"]] == [default]
    assert injected(plain)["stores"] == [{"store": "default", "access": "read_write"}]
    assert {m["id"] for m in injected(both)["memories"]} == {default, team}
    assert injected(both)["stores"] == [{"store": "team", "access": "read_only"}, {"store": "default", "access": "read_write"}]
    assert [m["id"] for m in injected(team_only)["memories"]] == [team] and POLARS[1] in store.log.events(team_only)[0].payload["system"]
    assert PANDAS[1] not in store.log.events(team_only)[0].payload["system"]
    assert injected(nothing) is None and store.log.events(nothing)[0].payload["config"]["memory"] == {"stores": ["empty"]}

    # recall finds the accepted memories of the mounts, never a proposed one or an unmounted store's
    def recalled(sid):
        out = asyncio.run(asyncio.to_thread(recall, store, {"query": "polars pandas dataframes"}, ctx(store.log, sid)))
        return {r["id"] for r in out.details["recalled"]}

    assert recalled(plain) == {default} and recalled(both) == {default, team} and recalled(team_only) == {team}
    assert recalled(nothing) == set() and proposed not in recalled(both)


@pytest.mark.parametrize("config, says", [
    ({"stores": [f"s{i}" for i in range(9)]}, "at most 8"),
    ({"stores": ["team", "team"]}, "twice"),
    ({"stores": [{"name": "team", "access": "write"}]}, "one of read_only, read_write"),
    ({"stores": [{"name": "Team"}]}, "store name 'Team' is not valid"),
    ({"stores": [{"name": "team", "mode": "ro"}]}, "unknown key 'mode'"),
    ({"stores": []}, "empty"),
    ({"stores": "team"}, "must be a list"),
    ({"stores": [["team"]]}, "must be a store name or an object"),
    ({"mounts": ["team"]}, "unknown key 'mounts'"),
    ("team", "must be an object"),
])
def test_bad_mounts_create_no_session(brain, store, config, says):
    before = len(store.log.sessions())
    with pytest.raises(ConfigError, match=says):
        brain.create_session(title="t", model="scripted", config={"memory": config})
    assert len(store.log.sessions()) == before


# -- dreams into a chosen store ------------------------------------------------------------------------


def dream_into(brain, store, sessions, target=None, read_only=None):
    dream_id = create_dream(brain, store, sessions=sessions, model="scripted:dream", target=target, read_only=read_only)
    return asyncio.run(run_dream(brain, store, dream_id))


def test_a_dream_writes_into_its_store_and_reads_for_it(brain, store, recorded):
    team = dream_into(brain, store, recorded, target="team")
    assert team["stop_reason"] == "end_turn" and len(team["proposed"]) >= 4
    assert {store.get(m)["store"] for m in team["proposed"]} == {"team"} and store.list(store="default") == []
    assert dream_status(store, team["dream_id"])["store"] == "team"
    assert [d["store"] for d in list_dreams(store)] == ["team"]
    config = store.log.events(team["dream_id"], until=1)[0].payload["config"]
    assert config["dream"]["store"] == "team" and config["memory"] == {"stores": [{"name": "team", "access": "read_write"}]}
    # read for "team": the same sessions are still unread for "default", whose dream proposes the same facts there
    assert set(store.bookmarks("team")) == set(recorded) and store.bookmarks("default") == {}
    default = dream_into(brain, store, recorded)
    assert len(default["proposed"]) == len(team["proposed"])
    assert {store.get(m)["store"] for m in default["proposed"]} == {"default"}
    assert sorted(m["title"] for m in store.list(store="default")) == sorted(m["title"] for m in store.list(store="team"))
    # and a second dream into "team" finds nothing new
    assert dream_into(brain, store, recorded, target="team")["proposed"] == []
    with pytest.raises(ConfigError, match="store name"):
        create_dream(brain, store, sessions=recorded, model="scripted:dream", target="No Such")


def test_a_dream_cannot_change_a_store_it_mounts_read_only(brain, store, recorded):
    shared = remember(store, *POLARS, name="team")
    dream_id = create_dream(brain, store, sessions=recorded, model="scripted:dream", read_only=["team"])
    c = ctx(store.log, dream_id)
    listing = read_memories(store, {}, c).content[0]["text"]
    assert f"[{shared}] (accepted, store team, read-only)" in listing
    cite = [{"session_id": recorded[1], "seq": 1, "quote": "I prefer duckdb over pandas"}]
    edit = propose_edit(store, {"memory_id": shared, "title": "Prefer duckdb", "text": "Prefer duckdb.", "provenance": cite}, c)
    assert edit.is_error and "mounts read-only" in edit.content[0]["text"]
    retire = propose_retire(store, {"memory_id": shared, "reason": "out of date"}, c)
    assert retire.is_error and "mounts read-only" in retire.content[0]["text"]
    supersede = propose_memory(store, {"title": "Prefer duckdb", "text": "Prefer duckdb.", "provenance": cite,
                                       "supersedes": [shared]}, c)
    assert supersede.is_error and "mounts read-only" in supersede.content[0]["text"]
    # a session whose own store is mounted read-only proposes nothing at all
    ro = brain.create_session(title="ro dream", model="scripted:dream", kind="dream", config={
        "dream": {"sessions": recorded, "store": "team"}, "memory": {"stores": [{"name": "team", "access": "read_only"}]}})["id"]
    out = propose_memory(store, {"title": "Prefer duckdb", "text": "Prefer duckdb.", "provenance": cite}, ctx(store.log, ro))
    assert out.is_error and "mounts it read-only" in out.content[0]["text"]
    # a memory of a store that is not mounted is not there at all
    hidden = remember(store, "Hidden", "A memory of another store.", name="secret-team")
    gone = propose_edit(store, {"memory_id": hidden, "title": "x", "text": "y", "provenance": cite}, c)
    assert gone.is_error and f"there is no memory {hidden!r}" in gone.content[0]["text"]
    assert hidden not in read_memories(store, {}, c).content[0]["text"]
    assert store.get(shared)["version"] == 1 and [m["id"] for m in store.list(store="team")] == [shared]


# -- export and import ------------------------------------------------------------------------------------


def reviewed_store(brain, store, recorded) -> list[str]:
    """A dream's proposals in "default", then review: accept with an edit, reject, merge, redact."""
    ids = dream_into(brain, store, recorded)["proposed"]
    store.review(ids[0], "accept", "person:ann", text="Print results with two decimals.")
    store.review(ids[1], "reject", "person:bob", note="too specific")
    store.review(ids[2], "merge", "person:ann", **{"with": [ids[3]]}, text="Merged <script>alert(1)</script>")
    store.review(ids[0], "redact", "person:ann", reason="personal data")
    return ids


def test_export_then_import_keeps_every_version_and_its_provenance(brain, store, recorded, tmp_path):
    ids = reviewed_store(brain, store, recorded)
    doc = export_store(store, "default", "person:ann")
    assert doc["format"] == FORMAT and doc["format_version"] == FORMAT_VERSION and doc["store"] == "default"
    assert doc["exported_by"] == "person:ann" and {m["id"] for m in doc["memories"]} == {m["id"] for m in store.list()}
    assert len(doc["links"]) == 2 and all(v["title"] == REDACTED and v["text"] == REDACTED
                                          for m in doc["memories"] if m["id"] == ids[0] for v in m["versions"])
    with pytest.raises(UnknownMemory, match="stores with memories: default"):
        export_store(store, "team", "person:ann")

    other = DuckDBLog(tmp_path / "other.duckdb")
    try:
        there = MemoryStore(other)
        report = import_store(there, json.dumps(doc).encode(), "person:carol", into="team")
        assert report["store"] == "team" and report["source_store"] == "default" and report["actor"] == "person:carol"
        assert sorted(report["imported"]) == sorted(m["id"] for m in doc["memories"]) and report["skipped"] == []
        for m in store.list():
            mine, theirs = store.get(m["id"]), there.get(m["id"])
            assert theirs["store"] == "team"
            for key in ("history", "redactions", "provenance", "status", "created_at", "created_by", "proposal",
                        "targets", "dream_id", "supersedes", "superseded_by", "title", "text"):
                assert theirs[key] == mine[key], key
            assert theirs["imports"][0]["actor"] == "person:carol" and theirs["imports"][0]["exported_by"] == "person:ann"
        merged = there.get(store.get(ids[2])["current"])
        assert merged["text"] == "Merged <script>alert(1)</script>"  # text, stored as it came
        assert there.get(ids[0])["status"] == "redacted" and all(v["text"] == REDACTED for v in there.get(ids[0])["history"])
        # importing again skips every memory, with a report, and writes only the record of the import
        again = import_store(there, json.dumps(doc).encode(), "person:carol", into="team")
        assert again["imported"] == [] and len(again["skipped"]) == len(doc["memories"])
        assert "in store 'team' already" in again["skipped"][0]["why"]
        imports = there._rows("SELECT count(*) FROM memory_imports")[0][0]
        assert imports == 2
        # the same ids into another store: refused as a whole, nothing written
        with pytest.raises(MemoryConflict, match="exists in store 'team'"):
            import_store(there, json.dumps(doc).encode(), "person:carol", into="default")
        assert there.list(store="default") == [] and there._rows("SELECT count(*) FROM memory_imports")[0][0] == imports
    finally:
        other.close()


def test_an_import_for_review_brings_accepted_memories_in_as_proposals(log, tmp_path):
    """`review`: what was accepted elsewhere is a proposal here, its history kept and the importer's
    version on top; a session that mounts the store is told it only once a person accepts it."""
    store = MemoryStore(log)
    kept = store.review(remember(store, *POLARS, name="team", status="proposed", actor="dream:d1"), "accept", "person:ann")
    rejected = store.review(remember(store, "Use tabs", "Indent with tabs.", name="team", status="proposed",
                                     actor="dream:d1"), "reject", "person:ann")
    doc = json.dumps(export_store(store, "team", "person:ann")).encode()

    other = DuckDBLog(tmp_path / "other.duckdb")
    try:
        there = MemoryStore(other)
        report = import_store(there, doc, "person:carol", into="lab", review=True)
        assert report["to_review"] == [kept["id"]] and sorted(report["imported"]) == sorted([kept["id"], rejected["id"]])
        came = there.get(kept["id"])
        assert came["status"] == "proposed" and came["store"] == "lab"
        assert [v["action"] for v in came["history"]] == [v["action"] for v in kept["history"]] + ["propose"]
        top = came["history"][-1]
        assert top["actor"] == "person:carol" and "for review" in top["note"] and came["text"] == kept["text"]
        assert there.get(rejected["id"])["status"] == "rejected"  # only what was accepted is put up for review
        assert there.injection("polars dataframes", ["lab"])[1] == []  # told to no session yet
        there.review(kept["id"], "accept", "person:carol")
        assert [m["id"] for m in there.injection("polars dataframes", ["lab"])[1]] == [kept["id"]]
    finally:
        other.close()


def test_a_redacted_memory_comes_in_redacted_whatever_the_file_says(log):
    store = MemoryStore(log)
    doc = {"format": FORMAT, "format_version": 1, "store": "default", "links": [], "memories": [{
        "id": "m00000000aa", "created_at": "2026-11-01T10:00:00+00:00", "created_by": "person:ann", "proposal": "create",
        "targets": [],
        "versions": [
            {"version": 1, "ts": "2026-11-01T10:00:00+00:00", "actor": "person:ann", "action": "create",
             "title": "Ann's phone", "text": "Ann's phone number is 555 0100", "tags": [], "status": "accepted",
             "provenance": [{"session_id": "s1", "seq": 3, "quote": "call Ann on 555 0100"}], "note": None},
            {"version": 2, "ts": "2026-11-02T10:00:00+00:00", "actor": "person:ann", "action": "redact",
             "title": "[redacted]", "text": "Ann's phone number is 555 0100", "tags": [], "status": "redacted",
             "provenance": [{"session_id": "s1", "seq": 3, "quote": "call Ann on 555 0100"}], "note": "personal data"}],
        "redactions": [{"version": 2, "ts": "2026-11-02T10:00:00+00:00", "actor": "person:ann", "reason": "personal data",
                        "versions": [1]}]}]}
    import_store(store, json.dumps(doc).encode(), "person:carol")
    m = store.get("m00000000aa")
    assert m["status"] == "redacted" and "555" not in json.dumps(m)
    assert [c["quote"] for v in m["history"] for c in v["provenance"]] == [REDACTED, REDACTED]


def good_doc() -> dict:
    return {"format": FORMAT, "format_version": 1, "store": "team", "exported_at": "2026-11-30T10:00:00+00:00",
            "exported_by": "person:ann", "links": [], "memories": [{
                "id": "m00000000bb", "created_at": "2026-11-01T10:00:00+00:00", "created_by": "dream:d1",
                "proposal": "create", "targets": [], "dream_id": "d1", "redactions": [],
                "versions": [{"version": 1, "ts": "2026-11-01T10:00:00+00:00", "actor": "dream:d1", "action": "propose",
                              "title": "<script>alert(1)</script>", "text": "<img src=x onerror=alert(1)> is text",
                              "tags": ["x"], "status": "proposed",
                              "provenance": [{"session_id": "s1", "seq": 2, "quote": "quoted words"}], "note": None}]}]}


def mutated(change) -> bytes:
    doc = good_doc()
    change(doc)
    return json.dumps(doc).encode()


def _set(path, value):
    def change(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def _twice(doc):
    doc["memories"].append(json.loads(json.dumps(doc["memories"][0])))


def _nested(depth):
    return b'{"format": "workbench-memory-store", "format_version": 1, "store": "team", "links": [], "memories": ' \
           + b"[" * depth + b"]" * depth + b"}"


V = ["memories", 0, "versions", 0]
TOKEN = "ghp_Qk7RmX2vN9sTz4LpW8yB3cJ6hF1dG5aE0uKi"  # the shape of a GitHub token
HOSTILE = [
    (b"{not json", "not JSON"),
    (b"", "not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"format": "workbench-memory-store", "format_version": NaN}', "NaN is not a JSON number"),
    (mutated(_set(V + ["tags"], ["a"])).replace(b'"seq": 2', b'"seq": Infinity'), "Infinity is not a JSON number"),
    (mutated(_set(["format_version"], 2)), "format_version: is 2; this workbench reads format version 1"),
    (mutated(_set(["format_version"], True)), "format_version"),
    (mutated(_set(["format"], "something-else")), "not a workbench memory store export"),
    (b"[]", "must be an object"),
    (_nested(100_000), "nested too deeply"),
    (_nested(50), "memories[0]"),
    (mutated(_set(["memories", 0, "versions"], [[[[{"x": [[]]}]]]])), "versions[0]: must be an object"),
    (mutated(_twice), "memories[1].id: m00000000bb is also memories[0].id"),
    (b'{"format": "a", "format": "b"}', "the key 'format' appears twice"),
    (mutated(_set(V + ["title"], "\ud800 lone")), "lone surrogate"),
    (mutated(_set(V + ["text"], "nul \x00 inside")), "NUL"),
    (mutated(_set(V + ["actor"], "root")), "is not an actor"),
    (mutated(_set(V + ["version"], 2)), "numbered 1, 2"),
    (mutated(_set(V + ["status"], "live")), "one of proposed"),
    (mutated(_set(V + ["ts"], "yesterday")), "not an ISO 8601 time"),
    (mutated(_set(V + ["title"], "x" * 201)), "at most 200"),
    (mutated(_set(V + ["provenance"], [{"session_id": "s1", "seq": -1}])), "seq: must be a whole number"),
    (mutated(_set(V + ["provenance"], [{"session_id": "s1", "seq": 1, "html": "<b>"}])), "unknown key 'html'"),
    (mutated(_set(["memories", 0, "targets"], ["m00000000cc"])), "is not another memory of the file"),
    (mutated(_set(["memories", 0, "id"], "export")), "is not a memory id"),
    (mutated(_set(["store"], "Team!")), "store name"),
    (mutated(_set(["extra"], 1)), "unknown key 'extra'"),
    (mutated(_set(V + ["status"], "redacted")), "a redacted memory ends with its redaction"),
    (mutated(_set(["links"], [{"memory_id": "m00000000bb", "by_id": "m00000000dd", "ts": "2026-11-01T10:00:00",
                               "actor": "person:ann", "kind": "merge"}])), "links[0].by_id: m00000000dd is not a memory"),
    (mutated(_set(V + ["text"], f"deploy with {TOKEN}")), "looks like a secret"),
]


@pytest.mark.parametrize("data, says", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_a_hostile_file_is_refused_and_writes_nothing(db_path, data, says):
    log = DuckDBLog(db_path)
    try:
        store = MemoryStore(log)
        kept = remember(store, *PANDAS)
        with pytest.raises(ConfigError, match=None) as e:
            import_store(store, data, "person:carol")
        assert says in str(e.value), str(e.value)
        assert len(str(e.value)) < 600 and "\n" not in str(e.value)  # one line a person can act on
        assert [m["id"] for m in store.list()] == [kept]
    finally:
        log.close()
    assert counts(db_path) == (1, 1, 0, 0, 0)


def test_an_oversized_file_is_refused_before_it_is_parsed(log):
    store = MemoryStore(log)
    with pytest.raises(ConfigError, match="an export takes at most"):
        import_store(store, b" " * (MAX_FILE_BYTES + 1), "person:carol")
    assert store.list() == []


def test_script_bearing_titles_are_stored_as_text(log):
    store = MemoryStore(log)
    report = import_store(store, mutated(lambda d: None), "person:carol")
    m = store.get(report["imported"][0])
    assert m["title"] == "<script>alert(1)</script>" and m["text"] == "<img src=x onerror=alert(1)> is text"
    assert m["store"] == "team" and m["status"] == "proposed" and m["dream_id"] == "d1"
    assert m["provenance"] == [{"session_id": "s1", "seq": 2, "quote": "quoted words"}]
    assert m["history"][0]["actor"] == "dream:d1" and m["history"][0]["ts"].startswith("2026-11-01T10:00:00")


def full_doc() -> dict:
    """An export with every field that a prompt, a panel or a listing may show: two memories (one redacted, with a
    redaction record), a note, tags, a quote, a dream id and a link between them."""
    cite = {"session_id": "s1", "seq": 2, "quote": "quoted words"}
    version = {"version": 1, "ts": "2026-11-01T10:00:00+00:00", "actor": "dream:d1", "action": "propose",
               "title": "Prefer polars", "text": "Prefer polars for dataframes.", "tags": ["data"], "status": "accepted",
               "provenance": [cite], "note": "seen twice"}
    redacted = [{**version, "title": "[redacted]", "text": "[redacted]", "status": "accepted"},
                {**version, "version": 2, "actor": "person:ann", "action": "redact", "title": "[redacted]",
                 "text": "[redacted]", "status": "redacted", "note": "personal data"}]
    return {"format": FORMAT, "format_version": 1, "store": "team", "exported_at": "2026-11-30T10:00:00+00:00",
            "exported_by": "person:ann", "memories": [
                {"id": "m00000000bb", "created_at": "2026-11-01T10:00:00+00:00", "created_by": "dream:d1",
                 "proposal": "create", "targets": [], "dream_id": "d1", "redactions": [], "versions": [version]},
                {"id": "m00000000cc", "created_at": "2026-11-01T10:00:00+00:00", "created_by": "dream:d1",
                 "proposal": "create", "targets": [], "dream_id": "d1", "versions": redacted,
                 "redactions": [{"version": 2, "ts": "2026-11-02T10:00:00+00:00", "actor": "person:ann",
                                 "reason": "personal data", "versions": [1]}]}],
            "links": [{"memory_id": "m00000000cc", "by_id": "m00000000bb", "ts": "2026-11-03T10:00:00+00:00",
                       "actor": "person:ann", "kind": "supersede"}]}


M, R = ["memories", 0], ["memories", 1]
KEY_ID = "AKIAQK7RMX2VN9STZ4LP"  # the shape of an AWS access key id: letters and digits, so it has the form of an id too
# every field a prompt, a panel or a listing may show, with a secret in it that has the field's own form
SECRET_FIELDS = [
    (["exported_by"], f"person:{KEY_ID}", "exported_by"),
    (M + ["created_by"], f"dream:{KEY_ID}", "memories[0].created_by"),
    (M + ["dream_id"], KEY_ID, "memories[0].dream_id"),
    (M + ["versions", 0, "actor"], f"person:{TOKEN}", "memories[0].versions[0].actor"),
    (M + ["versions", 0, "title"], f"token {TOKEN}", "memories[0].versions[0].title"),
    (M + ["versions", 0, "text"], f"deploy with {TOKEN}", "memories[0].versions[0].text"),
    (M + ["versions", 0, "tags"], ["data", TOKEN], "memories[0].versions[0].tags"),
    (M + ["versions", 0, "note"], f"it was {TOKEN}", "memories[0].versions[0].note"),
    (M + ["versions", 0, "provenance", 0, "session_id"], KEY_ID, "memories[0].versions[0].provenance[0].session_id"),
    (M + ["versions", 0, "provenance", 0, "quote"], f"export GH={TOKEN}", "memories[0].versions[0].provenance[0].quote"),
    (R + ["redactions", 0, "actor"], f"api:{TOKEN}", "memories[1].redactions[0].actor"),
    (R + ["redactions", 0, "reason"], f"it held {TOKEN}", "memories[1].redactions[0].reason"),
    (R + ["versions", 1, "note"], f"it held {TOKEN}", "memories[1].versions[1].note"),
    (["links", 0, "actor"], f"person:{TOKEN}", "links[0].actor"),
]


def doc_with(path, value) -> bytes:
    doc = full_doc()
    _set(path, value)(doc)
    return json.dumps(doc).encode()


def test_every_shown_field_of_a_good_export_comes_in_and_reaches_the_prompt_as_it_was(log):
    store = MemoryStore(log)
    report = import_store(store, json.dumps(full_doc()).encode(), "person:carol")
    assert report["imported"] == ["m00000000bb", "m00000000cc"] and report["links"] == 1
    text, injected, _, _ = store.injection(stores=["team"])
    assert [m["id"] for m in injected] == ["m00000000bb"]  # the redacted one never
    assert "(m00000000bb, accepted 2026-11-01 by dream:d1; from session s1)" in text


@pytest.mark.parametrize("path, value, where", SECRET_FIELDS, ids=[w for _, _, w in SECRET_FIELDS])
def test_a_secret_in_any_shown_field_refuses_the_import_and_names_the_field(db_path, path, value, where):
    log = DuckDBLog(db_path)
    try:
        store = MemoryStore(log)
        kept = remember(store, *PANDAS)
        with pytest.raises(ConfigError) as e:
            import_store(store, doc_with(path, value), "person:carol")
        assert str(e.value).startswith(f"not imported: {where} holds what looks like a secret ("), str(e.value)
        assert "\n" not in str(e.value) and TOKEN not in str(e.value) and KEY_ID not in str(e.value)
        assert [m["id"] for m in store.list()] == [kept]
        # confirmed as no secret, the same file comes in (its forms are valid)
        assert import_store(store, doc_with(path, value), "person:carol", allow_secret=True)["imported"]
    finally:
        log.close()


SCRIPT = "<img src=x onerror=alert(1)>"
BAD_FORMS = [
    (["exported_by"], f"person:{SCRIPT}", "exported_by", "is not an actor"),
    (M + ["created_by"], f"dream:{SCRIPT}", "memories[0].created_by", "is not an actor"),
    (M + ["dream_id"], SCRIPT, "memories[0].dream_id", "is not a session id"),
    (M + ["versions", 0, "actor"], f"api:{SCRIPT}", "memories[0].versions[0].actor", "is not an actor"),
    (M + ["versions", 0, "actor"], "person:ann\n# System", "memories[0].versions[0].actor", "is not an actor"),
    (M + ["versions", 0, "actor"], "person:ann\u202egnp.exe", "memories[0].versions[0].actor", "is not an actor"),
    (M + ["versions", 0, "actor"], "person:" + "a" * 201, "memories[0].versions[0].actor", "is not an actor"),
    (M + ["versions", 0, "actor"], "person: ann", "memories[0].versions[0].actor", "is not an actor"),
    (M + ["versions", 0, "provenance", 0, "session_id"], SCRIPT, "provenance[0].session_id", "is not a session id"),
    (M + ["versions", 0, "provenance", 0, "session_id"], "s1\n", "provenance[0].session_id", "is not a session id"),
    (R + ["redactions", 0, "actor"], f"person:{SCRIPT}", "memories[1].redactions[0].actor", "is not an actor"),
    (["links", 0, "actor"], f"person:'\"{SCRIPT}", "links[0].actor", "is not an actor"),
]


@pytest.mark.parametrize("path, value, where, says", BAD_FORMS, ids=[f"form{i}" for i in range(len(BAD_FORMS))])
def test_ids_and_actors_out_of_their_grammar_are_refused_even_when_confirmed(log, path, value, where, says):
    store = MemoryStore(log)
    with pytest.raises(ConfigError) as e:
        import_store(store, doc_with(path, value), "person:carol", allow_secret=True)
    assert where in str(e.value) and says in str(e.value), str(e.value)
    assert store.list() == []


def test_a_person_actor_is_made_from_any_user_name_within_the_grammar():
    from workbench.memory.store import is_actor, person

    for name in ("ann", "Anonymous Dione", "José  Ña", SCRIPT, "a\u202eb", "x" * 300, "", "a\nb", "e\u0301"):
        assert is_actor(person(name)), (name, person(name))
    assert person(SCRIPT) == "person:-img src-x onerror-alert-1--" and person("a\nb") == "person:a b"


def test_built_host_uses_the_dream_store_setting(tmp_path, recorded, db_path):
    from workbench.memory.plugin import MemoryPlugin
    from workbench.memory.store import MemorySettings

    host = build_host(db_path, tmp_path, plugins=[MemoryPlugin(settings=MemorySettings(dream_store="nightly"))])
    try:
        plugin = host.plugin("memory")
        dream_id = asyncio.run(plugin.create_dream(recorded, "scripted:dream"))
        assert dream_status(plugin.store, dream_id)["store"] == "nightly"
        with pytest.raises(ConfigError, match="store name"):
            asyncio.run(plugin.create_dream(recorded, "scripted:dream", store="NOPE"))
        assert [d["id"] for d in list_dreams(plugin.store)] == [dream_id]
    finally:
        asyncio.run(host.close())


# -- through the server (a real in-process Jupyter server) ---------------------------------------------------




async def dream_to_the_end(jp_fetch, jp_ws_fetch, body):
    code, started = await call(jp_fetch, "POST", "dreams", body=body)
    assert code == 202, started
    ws = await jp_ws_fetch("workbench", "api", "sessions", started["dream_id"], "stream", params={"after": "0"})
    try:
        while True:
            msg = json.loads(await ws.read_message())
            if msg["kind"] == "event" and msg["event"]["type"] == "dream_ended":
                break
    finally:
        ws.close()
    code, dream = await call(jp_fetch, "GET", "dreams", started["dream_id"])
    assert code == 200
    return dream


async def test_stores_through_the_rest_api(recorded, jp_fetch, jp_ws_fetch):
    # a bad store refuses the dream before anything is created
    code, err = await call(jp_fetch, "POST", "dreams", body={"sessions": recorded, "model": "scripted:dream", "store": "No!"})
    assert code == 400 and "store" in err["error"]
    assert (await call(jp_fetch, "GET", "dreams"))[1]["dreams"] == []

    dream = await dream_to_the_end(jp_fetch, jp_ws_fetch, {"sessions": recorded, "model": "scripted:dream", "store": "team"})
    assert dream["store"] == "team" and {m["store"] for m in dream["proposals"]} == {"team"}
    ids = [m["id"] for m in dream["proposals"]]
    code, listed = await call(jp_fetch, "GET", "memories", params={"store": "team"})
    assert code == 200 and [m["id"] for m in listed["memories"]] == ids
    assert (await call(jp_fetch, "GET", "memories", params={"store": "default"}))[1]["memories"] == []
    code, err = await call(jp_fetch, "GET", "memories", params={"store": "../x"})
    assert code == 400 and "store" in err["error"]
    code, found = await call(jp_fetch, "GET", "recall", params={"q": "decimals duckdb pandas", "store": "team"})
    assert code == 200 and found["memories"] == []  # nothing accepted yet

    # review keeps the store; a merge across stores is a 409 that changes nothing
    code, m = await call(jp_fetch, "PATCH", "memories", ids[0], body={"action": "accept", "title": "Two decimals <b>always</b>"})
    assert code == 200 and m["store"] == "team" and m["status"] == "accepted"
    code, merged = await call(jp_fetch, "PATCH", "memories", ids[1], body={"action": "merge", "with": [ids[2]], "text": "merged"})
    assert code == 200 and merged["store"] == "team"
    code, found = await call(jp_fetch, "GET", "recall", params={"q": "decimals", "store": "team"})
    live = {m["id"] for m in (await call(jp_fetch, "GET", "memories", params={"store": "team", "status": "accepted"}))[1]["memories"]}
    found_ids = [m["id"] for m in found["memories"]]  # the accepted memory, and the merge if it says "decimals" too
    assert code == 200 and ids[0] in found_ids and set(found_ids) <= live and merged["id"] in live, (found_ids, live)
    assert (await call(jp_fetch, "GET", "recall", params={"q": "decimals", "store": "default"}))[1]["memories"] == []

    # a session that mounts "team" read-only is told its accepted memory, and the log says what it mounted
    code, s = await call(jp_fetch, "POST", "sessions", body={
        "model": "scripted", "config": {"memory": {"stores": [{"name": "team", "access": "read_only"}]}}})
    assert code == 201, s
    events = (await call(jp_fetch, "GET", "sessions", s["id"], "events"))[1]["events"]
    assert events[1]["type"] == "memories_injected" and events[1]["payload"]["stores"] == [{"store": "team", "access": "read_only"}]
    assert {m["id"] for m in events[1]["payload"]["memories"]} == {ids[0], merged["id"]}
    code, plain = await call(jp_fetch, "POST", "sessions", body={"model": "scripted"})
    assert [e["type"] for e in (await call(jp_fetch, "GET", "sessions", plain["id"], "events"))[1]["events"]] == ["session_created"]
    sessions = len((await call(jp_fetch, "GET", "sessions"))[1]["sessions"])
    for bad in ({"stores": ["a"] * 9}, {"stores": [{"name": "team", "access": "rw"}]}, {"stores": "team"}, "x"):
        code, err = await call(jp_fetch, "POST", "sessions", body={"model": "scripted", "config": {"memory": bad}})
        assert code == 400 and "config.memory" in err["error"], err
    assert len((await call(jp_fetch, "GET", "sessions"))[1]["sessions"]) == sessions

    # export, then import: the same file again skips everything; a bad one is a 400 that writes nothing
    code, doc = await call(jp_fetch, "GET", "memories", "export", params={"store": "team"})
    assert code == 200 and doc["format"] == FORMAT and doc["store"] == "team" and doc["exported_by"].startswith("person:")
    assert {m["id"] for m in doc["memories"]} == {m["id"] for m in (await call(jp_fetch, "GET", "memories"))[1]["memories"]}
    code, err = await call(jp_fetch, "GET", "memories", "export", params={"store": "nobody"})
    assert code == 404 and "no memory is in store 'nobody'" in err["error"]
    assert (await call(jp_fetch, "GET", "memories", "export"))[0] == 400  # store is required

    async def post_import(data: bytes, **params):
        from tornado.httpclient import HTTPClientError

        try:
            r = await jp_fetch("workbench", "api", "memories", "import", method="POST", body=data, params=params or None)
            return r.code, json.loads(r.body)
        except HTTPClientError as e:
            return e.code, json.loads(e.response.body)

    code, report = await post_import(json.dumps(doc).encode())
    assert code == 200 and report["imported"] == [] and len(report["skipped"]) == len(doc["memories"])
    assert report["actor"].startswith("person:")
    code, err = await post_import(json.dumps(doc).encode(), store="other")
    assert code == 409 and "exists in store 'team'" in err["error"]
    before = (await call(jp_fetch, "GET", "memories"))[1]["memories"]
    # a number too long or too big is refused before it is parsed (a 5,000-digit integer was a 500: issue 22)
    numbers = [json.dumps({**doc, "format_version": 7}).replace('"format_version": 7', f'"format_version": {n}').encode()
               for n in ("9" * 5000, "-" + "9" * 5000, "1e400", "NaN", "-Infinity", "1E99999999999999999999")]
    for data in (b"{oops", b"\xff\xfe", json.dumps({**doc, "format_version": 9}).encode(), mutated(_twice), *numbers):
        code, err = await post_import(data)
        assert code == 400 and "export" in err["error"], (data[:40], err)
    code, err = await post_import(b" " * (MAX_FILE_BYTES + 1))
    assert code == 413
    for bad in ("maybe", "1e9", ""):
        code, err = await post_import(mutated(lambda d: None), store="imported", review=bad)
        assert code == 400 and "review" in err["error"], (bad, err)
    def accepted_there(d):
        d["memories"][0]["versions"].append({**d["memories"][0]["versions"][0], "version": 2, "action": "accept",
                                             "status": "accepted", "actor": "person:ann", "ts": "2026-11-02T10:00:00+00:00"})

    code, report = await post_import(mutated(accepted_there), store="imported", review="true")
    assert code == 200 and report["store"] == "imported" and report["to_review"] == report["imported"]
    code, got = await call(jp_fetch, "GET", "memories", report["imported"][0])
    assert got["status"] == "proposed" and got["history"][-1]["action"] == "propose"  # accepted in the file
    code, got = await call(jp_fetch, "GET", "memories", report["imported"][0])
    assert got["title"] == "<script>alert(1)</script>" and got["imports"][0]["id"] == report["import_id"]
    after = (await call(jp_fetch, "GET", "memories"))[1]["memories"]
    assert sorted(m["id"] for m in after) == sorted([m["id"] for m in before] + report["imported"])  # only what came in


# -- from the command line (real subprocesses on real files) -----------------------------------------------------


def test_stores_from_the_command_line(recorded, db_path, tmp_path):
    import getpass
    import subprocess
    import sys
    from pathlib import Path

    workbench = str(Path(sys.executable).parent / "workbench")

    def wb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([workbench, *args], capture_output=True, text=True, timeout=120)

    db, other = ["--db", str(db_path)], ["--db", str(tmp_path / "other.duckdb")]
    r = wb("dream", "--model", "scripted:dream", "--store", "team", "--sessions", *recorded, *db)
    assert r.returncode == 0, r.stderr
    team = [json.loads(line) for line in wb("memories", "--store", "team", "--json", *db).stdout.splitlines()]
    assert len(team) >= 4 and {m["store"] for m in team} == {"team"}
    assert wb("memories", "--store", "default", "--json", *db).stdout == ""
    listed = wb("memories", *db).stdout
    assert "store" in listed.splitlines()[0] and all(m["id"] in listed for m in team)

    out = tmp_path / "team.json"
    r = wb("memories", "export", "--store", "team", "-o", str(out), *db)
    assert r.returncode == 0 and "exported store team" in r.stderr, r.stderr
    doc = json.loads(out.read_text())
    assert doc["exported_by"] == f"person:{getpass.getuser()}" and {m["id"] for m in doc["memories"]} == {m["id"] for m in team}
    assert json.loads(wb("memories", "export", "--store", "team", *db).stdout)["memories"] == doc["memories"]

    r = wb("memories", "import", str(out), "--store", "copy", *other)
    assert r.returncode == 0 and f"imported {len(team)} memories" in r.stdout and "into store copy" in r.stdout, r.stderr
    copied = [json.loads(line) for line in wb("memories", "--json", *other).stdout.splitlines()]
    assert {m["id"] for m in copied} == {m["id"] for m in team} and {m["store"] for m in copied} == {"copy"}
    assert [m["provenance"] for m in copied] == [m["provenance"] for m in team]
    r = wb("memories", "import", str(out), "--store", "copy", *other)
    assert r.returncode == 0 and "imported 0 memories" in r.stdout and r.stdout.count("skipped") == len(team)
    # accepted in the file, a proposal here with --review
    assert wb("memory", team[0]["id"], "--action", "accept", *db).returncode == 0
    reviewed, third = tmp_path / "reviewed.json", ["--db", str(tmp_path / "third.duckdb")]
    assert wb("memories", "export", "--store", "team", "-o", str(reviewed), *db).returncode == 0
    r = wb("memories", "import", str(reviewed), "--review", *third)
    assert r.returncode == 0 and "1 accepted in the file came in as proposals" in r.stdout, (r.stdout, r.stderr)
    came = {m["id"]: m for m in (json.loads(line) for line in wb("memories", "--json", *third).stdout.splitlines())}
    assert came[team[0]["id"]]["status"] == "proposed" and {m["status"] for m in came.values()} == {"proposed"}

    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"format": "workbench-memory-store", "format_version": 1, "store": "x", "memories": [[[[]]]], "links": []}')
    for args, says in ((("import", str(bad)), "memories[0]: must be an object"),
                       (("import", str(tmp_path / "missing.json")), "cannot read"),
                       (("import",), "name the export file"),
                       (("export", "--store", "Bad Name"), "store name 'Bad Name' is not valid"),
                       (("--store", "team", "-o", str(tmp_path / "x.json")), "-o/--output goes with"),
                       (("export", "--store", "team", "--status", "accepted"), "--status filters the listing"),
                       (("export", "--store", "nobody"), "no memory is in store 'nobody'"),
                       (("export", "--store", "team", "--review"), "--review goes with")):
        r = wb("memories", *args, *other)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.returncode, r.stderr)
    assert [json.loads(line)["id"] for line in wb("memories", "--json", *other).stdout.splitlines()] == [m["id"] for m in copied]
    assert not (tmp_path / "x.json").exists()
