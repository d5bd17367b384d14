"""One conformance suite for every SessionLog: DuckDBLog (a real file) and MemoryLog.

Everything here is behaviour the brain and the server rely on, whichever log
they are given: seqs, refusals, transactions, subscribers, the sessions
listing, copies, threads, the async faces, strict payloads and closing.
What only a file has (locks, reopening, checkpoints, SQL) is in test_duckdb.py.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import enum
import logging
import math
import threading
from datetime import UTC, datetime

import pytest

from workbench.errors import (
    InvalidPayload,
    LogClosed,
    SessionExists,
    UnknownEventType,
    UnknownSession,
)
from workbench.log import EVENT_TYPES, DuckDBLog, LogSettings, MemoryLog, SessionLog

VERBATIM = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-opus-5-5",
    "content": [
        {"type": "thinking", "thinking": "", "signature": "EqQBCkYIBxgCKkAs=="},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
        {"type": "thinking", "thinking": "Let me check ünïcode and \"quotes\"\n", "signature": "sig2"},
        {"type": "text", "text": "Running it.", "citations": None},
        {"type": "tool_use", "id": "toolu_1", "name": "python", "input": {"code": "print(1)\n", "n": 1.5}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 0},
}


@pytest.fixture(params=["duckdb", "memory"])
def make_log(request, tmp_path):
    """A factory of logs of one implementation (keyword arguments go to the log); all closed at the end."""
    made: list = []

    def make(**kw):
        lg = DuckDBLog(tmp_path / f"log{len(made)}.duckdb", **kw) if request.param == "duckdb" else MemoryLog(**kw)
        made.append(lg)
        return lg

    yield make
    for lg in made:
        lg.close()


@pytest.fixture
def log(make_log):
    return make_log()


def new(log, sid: str = "s1", **kw) -> None:
    log.create_session(sid, title=kw.pop("title", "t"), model="scripted", payload=kw.pop("payload", {"system": "x"}), **kw)


def snapshot(log) -> tuple:
    """Everything a reader can see, to compare before and after something that must change nothing."""
    return [(r["id"], r["events"], r["last_seq"], r["title"]) for r in log.sessions()], [
        (e.session_id, e.seq, e.type, e.payload) for r in log.sessions() for e in log.events(r["id"])
    ]


def boom(exc: BaseException):
    raise exc


# -- seqs, refusals ------------------------------------------------------------


def test_is_a_session_log(log):
    assert isinstance(log, SessionLog)


def test_seqs_are_1_2_3_per_session(log):
    created = log.create_session("a", title=None, model="m", payload={"x": 1}, then=[("user_message", {"text": "hi"})])
    assert (created.seq, created.type, created.payload) == (1, "session_created", {"x": 1})
    new(log, "b")
    assert [log.append("a", "user_message", {"text": str(i)}).seq for i in range(3)] == [3, 4, 5]
    assert log.append("b", "user_message", {"text": "b"}).seq == 2
    assert [e.seq for e in log.events("a")] == [1, 2, 3, 4, 5]
    assert [e.type for e in log.events("a")][:2] == ["session_created", "user_message"]
    ev = log.events("a")[-1]
    assert ev.session_id == "a" and ev.ts.tzinfo == UTC
    assert abs((datetime.now(UTC) - ev.ts).total_seconds()) < 3600


def test_events_filters(log):
    new(log)
    for i in range(5):
        log.append("s1", "user_message" if i % 2 else "turn_ended", {"i": i})
    seqs = lambda **kw: [e.seq for e in log.events("s1", **kw)]  # noqa: E731
    assert seqs(after=3) == [4, 5, 6]
    assert seqs(after=3, until=5) == [4, 5]
    assert seqs(until=1) == [1]
    assert seqs(types=["user_message"]) == [3, 5]
    assert seqs(types=["user_message", "session_created"], limit=2) == [1, 3]
    assert seqs(types=[]) == [1, 2, 3, 4, 5, 6]  # no types given: every type
    assert seqs(after=2, limit=0) == []
    assert seqs(after=100) == [] and seqs(after=-5) == [1, 2, 3, 4, 5, 6]
    assert seqs(types=["not_a_type"]) == []
    assert log.events("no such session") == []


def test_unknown_type_unknown_session_and_duplicates_are_refused_and_write_nothing(log):
    new(log)
    before = snapshot(log)
    with pytest.raises(UnknownEventType, match="not documented"):
        log.append("s1", "not_a_type", {})
    with pytest.raises(UnknownEventType):
        log.append("s1", ["user_message"], {})  # not even a string
    with pytest.raises(UnknownSession):
        log.append("nope", "user_message", {"text": "x"})
    with pytest.raises(SessionExists):
        new(log)
    with pytest.raises(UnknownEventType):
        log.create_session("s2", title=None, model="m", payload={}, then=[("not_a_type", {})])
    assert snapshot(log) == before
    assert not log.has_session("s2")
    assert log.append("s1", "user_message", {"text": "still works"}).seq == 2


# -- transactions ----------------------------------------------------------------


def test_write_rolls_back_everything_fn_appended_when_it_raises(log):
    new(log)
    new(log, "other")
    before = snapshot(log)

    def fails(tx):
        tx.append("s1", "user_message", {"text": "a"})
        tx.append("other", "user_message", {"text": "b"})
        tx.append("s1", "user_message", {"text": "c"})
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        log.write(fails).result()
    assert snapshot(log) == before
    # seqs continue from what was committed, not from what was rolled back
    assert log.append("s1", "user_message", {"text": "d"}).seq == 2
    assert log.append("other", "user_message", {"text": "e"}).seq == 2


def test_a_failed_create_leaves_no_session(log):
    with pytest.raises(InvalidPayload):
        log.create_session("s1", title="t", model="m", payload={"config": {"temperature": 1e309}})
    assert not log.has_session("s1") and log.sessions() == [] and log.events("s1") == []
    with pytest.raises(UnknownSession):
        log.append("s1", "user_message", {"text": "x"})
    new(log)  # the id is free
    assert [e.seq for e in log.events("s1")] == [1]


def test_tx_events_reads_its_own_writes(log):
    new(log)
    log.append("s1", "user_message", {"text": "committed"})

    def fn(tx):
        before = [e.seq for e in tx.events("s1")]
        tx.append("s1", "turn_ended", {"stop_reason": "end_turn"})
        tx.append("s1", "user_message", {"text": "staged"})
        return before, tx.events("s1", after=2), tx.events("s1", types=["user_message"], limit=1), tx.events("nope")

    before, after, typed, nope = log.write(fn).result()
    assert before == [1, 2]
    assert [(e.seq, e.type) for e in after] == [(3, "turn_ended"), (4, "user_message")]
    assert [e.payload for e in typed] == [{"text": "committed"}]
    assert nope == []

    def created_and_read(tx):
        tx.append("s1", "user_message", {"text": "rolled back"})
        seen = [e.seq for e in tx.events("s1", after=4)]
        raise ValueError(str(seen))

    with pytest.raises(ValueError, match=r"\[5\]"):
        log.write(created_and_read).result()
    assert [e.seq for e in log.events("s1")] == [1, 2, 3, 4]


@pytest.mark.asyncio
async def test_awrite_and_aappend(log):
    new(log)
    ev = await log.aappend("s1", "user_message", {"text": "hi"})
    assert ev.seq == 2
    result = await log.awrite(lambda tx: [tx.append("s1", "turn_ended", {"stop_reason": "end_turn"}).seq, len(tx.events("s1"))])
    assert result == [3, 3]
    with pytest.raises(UnknownSession):
        await log.awrite(lambda tx: tx.append("nope", "user_message", {}))
    with pytest.raises(InvalidPayload):
        await log.aappend("s1", "user_message", {"x": math.nan})


@pytest.mark.asyncio
async def test_async_reads(log):
    new(log, "a")
    new(log, "b", kind="dream")
    assert await log.ahas_session("a") and not await log.ahas_session("zz")
    assert (await log.asession("b"))["kind"] == "dream"
    with pytest.raises(UnknownSession):
        await log.asession("zz")
    assert [r["id"] for r in await log.asessions()] == ["a", "b"]
    assert [r["id"] for r in await log.asessions(kind="dream")] == ["b"]
    assert [r["id"] for r in await log.asessions(ids=["a"])] == ["a"]
    assert [e.seq for e in await log.aevents("a", 0, until=1)] == [1]


# -- subscribers -------------------------------------------------------------------


def test_subscribers_hear_only_committed_events_on_the_writer_thread(log):
    new(log)
    seen = []

    def on_event(ev):
        # committed means readable by anyone, right now
        stored = [e.seq for e in log.events(ev.session_id, after=ev.seq - 1, until=ev.seq)]
        seen.append((ev.seq, stored, threading.current_thread().name))

    unsubscribe = log.subscribe(on_event)
    log.append("s1", "user_message", {"text": "hi"})
    with pytest.raises(RuntimeError):
        log.write(lambda tx: (tx.append("s1", "user_message", {"text": "rolled back"}), boom(RuntimeError("boom")))).result()
    with pytest.raises(InvalidPayload):
        log.write(lambda tx: (tx.append("s1", "user_message", {"text": "rolled back"}), tx.append("s1", "user_message", {"n": math.inf}))).result()
    log.write(lambda tx: [tx.append("s1", "user_message", {"text": str(i)}) for i in range(2)]).result()
    assert [(s, stored) for s, stored, _ in seen] == [(2, [2]), (3, [3]), (4, [4])]
    assert all(name.startswith("workbench-log-writer") for *_, name in seen)
    unsubscribe()
    unsubscribe()  # twice is harmless
    log.append("s1", "user_message", {"text": "unheard"})
    assert len(seen) == 3


def test_a_failing_subscriber_does_not_fail_the_committed_append(log, caplog):
    new(log)
    heard = []
    log.subscribe(lambda ev: boom(RuntimeError("subscriber bug")))
    log.subscribe(lambda ev: heard.append(ev.seq))
    with caplog.at_level(logging.ERROR, logger="workbench.log"):
        ev = log.append("s1", "user_message", {"text": "hi"})
        events = log.write(lambda tx: [tx.append("s1", "user_message", {"text": str(i)}) for i in range(2)]).result()
    assert ev.seq == 2 and [e.seq for e in events] == [3, 4]
    assert heard == [2, 3, 4]  # the others still heard every event
    assert [e.seq for e in log.events("s1")] == [1, 2, 3, 4]
    failures = [r for r in caplog.records if r.exc_info and str(r.exc_info[1]) == "subscriber bug"]
    assert len(failures) == 3 and all("is committed" in r.getMessage() for r in failures)


# -- sessions ------------------------------------------------------------------------


def test_sessions_rows_and_state(log):
    new(log, "a")
    new(log, "b", kind="dream", title=None)
    new(log, "c")
    log.append("b", "user_message", {"text": "x"})
    log.append("c", "user_message", {"text": "x"})
    log.append("c", "assistant_turn", {"message": VERBATIM})
    log.append("c", "turn_ended", {"stop_reason": "end_turn"})
    log.append("c", "hands_stopped", {"generation": 1})  # after the turn: still ended
    rows = log.sessions()
    assert [r["id"] for r in rows] == ["a", "b", "c"]  # oldest first
    a, b, c = rows
    assert set(a) == {"id", "created_at", "updated_at", "title", "model", "kind", "events", "last_seq", "last_type", "state",
                      "parent_id", "archived"}
    assert a["parent_id"] is None
    assert (a["events"], a["last_seq"], a["last_type"], a["state"], a["kind"], a["title"], a["model"]) == (
        1, 1, "session_created", "new", "chat", "t", "scripted")
    assert (b["events"], b["last_type"], b["state"], b["kind"], b["title"]) == (2, "user_message", "unfinished", "dream", None)
    assert (c["events"], c["last_seq"], c["last_type"], c["state"]) == (5, 5, "hands_stopped", "ended")
    for r in rows:
        created, updated = datetime.fromisoformat(r["created_at"]), datetime.fromisoformat(r["updated_at"])
        assert created.tzinfo is not None and updated >= created
    assert datetime.fromisoformat(c["updated_at"]) == log.events("c")[-1].ts
    log.append("c", "user_message", {"text": "again"})
    assert log.session("c")["state"] == "unfinished"
    assert log.session("a") == a
    assert [r["id"] for r in log.sessions(kind="dream")] == ["b"]
    assert [r["id"] for r in log.sessions(ids=["c", "a", "zz"])] == ["a", "c"]
    assert log.sessions(ids=[]) == [] and log.sessions(kind="nope") == []
    assert [r["id"] for r in log.sessions(ids=["a", "b"], kind="chat")] == ["a"]
    with pytest.raises(UnknownSession):
        log.session("zz")
    assert log.has_session("a") and not log.has_session("zz")


def test_a_child_session_names_its_parent_in_the_listing(log):
    new(log, "p")
    log.create_session("k", title="child", model="scripted", kind="delegate", payload={"parent_id": "p", "origin": {"index": 0}})
    # only session_created says who the parent is: a later event that says otherwise changes nothing
    log.append("k", "user_message", {"text": "x", "parent_id": "someone else"})
    log.create_session("odd", title="t", model="m", payload={"parent_id": 7})  # not an id: no parent
    rows = {r["id"]: r for r in log.sessions()}
    assert (rows["p"]["parent_id"], rows["k"]["parent_id"], rows["odd"]["parent_id"]) == (None, "p", None)
    assert log.session("k")["parent_id"] == "p"


# -- what is stored is never the caller's object -----------------------------------------


def test_stored_payloads_are_copies(log):
    payload = {"message": copy.deepcopy(VERBATIM), "list": [1, 2], "tuple": (1, "two")}
    new(log, payload=payload)
    ev = log.append("s1", "assistant_turn", payload)
    payload["message"]["content"].clear()
    payload["list"].append(3)
    ev.payload["message"]["id"] = "changed by the caller"
    first = log.events("s1")[1]
    first.payload["list"].append("changed by a reader")
    for stored in (log.events("s1")[0].payload, log.events("s1")[1].payload):
        assert stored["message"] == VERBATIM
        assert stored["list"] == [1, 2] and stored["tuple"] == [1, "two"]  # a tuple is a JSON array
    assert list(log.events("s1")[1].payload["message"]) == list(VERBATIM)  # key order kept
    row = log.session("s1")
    row["title"] = "changed"
    assert log.session("s1")["title"] == "t"


def test_what_json_dumps_took_is_stored_as_plain_json(log):
    class Score(float):
        pass

    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    Point = collections.namedtuple("Point", "x y")
    new(log)
    ev = log.append("s1", "user_message", {"score": Score(0.5), "level": Level.HIGH, Name("k"): Name("v"),
                                           "point": Point(1, 2), "od": collections.OrderedDict(a=1)})
    want = {"score": 0.5, "level": 3, "k": "v", "point": [1, 2], "od": {"a": 1}}
    assert ev.payload == want and log.events("s1")[1].payload == want
    assert type(log.events("s1")[1].payload["score"]) is float
    with pytest.raises(InvalidPayload, match="NaN or Infinity"):
        log.append("s1", "user_message", {"score": Score("nan")})


def test_assistant_turn_is_stored_verbatim(log):
    new(log)
    ev = log.append("s1", "assistant_turn", {"message": VERBATIM})
    stored = log.events("s1", types=["assistant_turn"])[0].payload["message"]
    assert repr(stored) == repr(VERBATIM) == repr(ev.payload["message"])  # same keys, order, values and types


@pytest.mark.parametrize("text", [
    "nul \x00 byte", "<script>alert(1)</script>", "emoji 🧪 and rtl \u202e gnp.exe", "\ufeffbom", "a" * 100_000,
    "\\u0000 not a nul", "line\r\nbreak\u2028sep",
])
def test_hostile_but_valid_strings_are_stored_exactly(log, text):
    log.create_session("s\x00<b>", title=text[:1000], model="m", payload={text[:200]: text})
    ev = log.append("s\x00<b>", "user_message", {"text": text, "nested": [{"k": text}]})
    got = log.events("s\x00<b>")
    assert got[1].payload == {"text": text, "nested": [{"k": text}]} == ev.payload
    assert got[0].payload == {text[:200]: text}
    assert log.session("s\x00<b>")["title"] == text[:1000]


# -- strict payloads ----------------------------------------------------------------------


class Cycle(dict):
    pass


def _cyclic():
    d: dict = {}
    d["self"] = d
    return d


def _nested(depth: int) -> dict:
    node: dict = {"leaf": 1}
    for _ in range(depth - 1):
        node = {"n": node}
    return node


HOSTILE = {
    "nan": {"x": math.nan},
    "infinity": {"config": {"temperature": math.inf}},
    "minus infinity": {"x": [1, -math.inf]},
    "1e309 parsed": {"config": {"budget": float("1e309")}},
    "lone surrogate": {"text": "ok \ud800 not"},
    "lone surrogate in a key": {"\udfff": 1},
    "surrogate deep": {"a": [{"b": ["\ud83d"]}]},
    "int key": {1: "x"},
    "tuple key": {"a": {(1, 2): "x"}},
    "None key": {None: 1},
    "bytes": {"data": b"\x00\xff"},
    "set": {"s": {1, 2}},
    "datetime": {"when": datetime.now()},
    "object": {"o": object()},
    "int beyond 64 bits": {"n": 2**64},
    "negative int beyond 64 bits": {"n": -(2**63) - 1},
    "too deep": _nested(65),
    "100k deep": _nested(100_000),
    "cycle": _cyclic(),
    "not an object": [1, 2, 3],
    "a string": "text",
    "None": None,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_payloads_are_refused_and_nothing_is_written(log, name):
    new(log)
    heard = []
    log.subscribe(heard.append)
    before = snapshot(log)
    with pytest.raises(InvalidPayload) as e:
        log.append("s1", "user_message", HOSTILE[name])
    assert "\n" not in str(e.value) and len(str(e.value)) < 400  # one line a person can act on
    with pytest.raises(InvalidPayload):
        log.write(lambda tx: (tx.append("s1", "user_message", {"text": "fine"}), tx.append("s1", "tool_result", HOSTILE[name]))).result()
    with pytest.raises(InvalidPayload):
        log.create_session("s2", title="t", model="m", payload=HOSTILE[name])
    with pytest.raises(InvalidPayload):
        log.create_session("s3", title="t", model="m", payload={}, then=[("user_message", HOSTILE[name])])
    assert snapshot(log) == before and heard == []
    assert log.append("s1", "user_message", {"text": "the log still works"}).seq == 2


def test_refusals_say_where(log):
    new(log)
    with pytest.raises(InvalidPayload, match=r"\$\.config\.temperature.*NaN or Infinity"):
        log.append("s1", "user_message", {"config": {"temperature": math.inf}})
    with pytest.raises(InvalidPayload, match=r"lone surrogate.*\$\.a\[0\]\.b\[1\]"):
        log.append("s1", "user_message", {"a": [{"b": ["ok", "\ud800"]}]})
    with pytest.raises(InvalidPayload, match=r"deeper than 64.*max_depth"):
        log.append("s1", "user_message", _nested(65))
    with pytest.raises(InvalidPayload, match=r"non-string key 1"):
        log.append("s1", "user_message", {1: 2})


def test_depth_and_size_limits_are_settings(make_log):
    log = make_log(settings=LogSettings(max_depth=3, max_payload_bytes=1000))
    new(log)
    log.append("s1", "user_message", _nested(3))
    log.append("s1", "user_message", {"a": [[1]]})
    with pytest.raises(InvalidPayload, match="deeper than 3"):
        log.append("s1", "user_message", {"a": [[[1]]]})
    log.append("s1", "user_message", {"text": "x" * 980})
    with pytest.raises(InvalidPayload, match=r"bytes as JSON; the log stores at most 1,000 \(log setting max_payload_bytes\)"):
        log.append("s1", "user_message", {"text": "x" * 1000})
    # bytes as stored, not characters: an escaped control character or a multi-byte letter counts in full
    with pytest.raises(InvalidPayload, match="max_payload_bytes"):
        log.append("s1", "user_message", {"text": "\x01" * 200})
    with pytest.raises(InvalidPayload, match="max_payload_bytes"):
        log.append("s1", "user_message", {"text": "€" * 400})
    assert len(log.events("s1")) == 4


def test_the_default_limits_refuse_a_huge_payload(log):
    new(log)
    with pytest.raises(InvalidPayload, match="max_payload_bytes"):
        log.append("s1", "user_message", {"text": "x" * (16 * 1024 * 1024)})
    assert len(log.events("s1")) == 1


FIELDS = {
    "id": [None, "", 5, "x" * 1001, "a\ud800", ["s"]],
    "title": [5, "x" * 1001, "t\udc00", {"t": 1}],
    "model": [5, "x" * 1001, "m\ud800"],
    "kind": [None, "", 5, "x" * 1001, "k\ud800"],
}


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in FIELDS.items() for v in vs])
def test_hostile_session_fields_are_refused(log, field, value):
    args = {"id": "s1", "title": "t", "model": "m", "kind": "chat", field: value}
    with pytest.raises(InvalidPayload, match=f"session's {field}"):
        log.create_session(args["id"], title=args["title"], model=args["model"], kind=args["kind"], payload={})
    assert log.sessions() == []


def test_session_fields_at_their_limits(log):
    log.create_session("i" * 1000, title="t" * 1000, model="m" * 1000, kind="k" * 1000, payload={})
    log.create_session("s2", title=None, model=None, payload={})
    log.create_session("s3", title="", model="", payload={})
    assert [(r["title"], r["model"]) for r in log.sessions()][1:] == [(None, None), ("", "")]
    assert log.session("i" * 1000)["kind"] == "k" * 1000


def test_hostile_read_arguments(log):
    new(log)
    assert log.events("a\ud800") == [] and not log.has_session("a\ud800") and not log.has_session(None)
    assert log.sessions(ids=["s1", "a\ud800", 5, None]) == log.sessions(ids=["s1"])
    assert log.sessions(kind="k\ud800") == []
    assert log.events("s1", types=["\ud800", 3]) == []
    with pytest.raises(UnknownSession):
        log.session("a\ud800")
    with pytest.raises(UnknownSession):
        log.append("a\ud800", "user_message", {})
    for bad in ({"limit": -1}, {"after": "1"}, {"until": 1.5}, {"limit": True}):
        with pytest.raises(ValueError):
            log.events("s1", **bad)
    assert log.write(lambda tx: tx.events("a\ud800")).result() == []


# -- event types ------------------------------------------------------------------------


def test_event_types_are_immutable_and_a_log_can_take_more(make_log):
    with pytest.raises(TypeError):
        EVENT_TYPES["plugin_event"] = "x"  # type: ignore[index]
    assert "plugin_event" not in EVENT_TYPES
    types = {**EVENT_TYPES, "plugin_event": "a plugin's own event"}
    log = make_log(event_types=types)
    new(log)
    assert log.append("s1", "plugin_event", {"n": 1}).seq == 2
    types["later_event"] = "added after the log was made"
    with pytest.raises(UnknownEventType):
        log.append("s1", "later_event", {})
    plain = make_log()
    new(plain)
    with pytest.raises(UnknownEventType):
        plain.append("s1", "plugin_event", {})


# -- threads ----------------------------------------------------------------------------


def test_concurrent_appends_and_reads(log):
    new(log)
    n_threads, per_thread = 8, 25
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(k: int) -> None:
        try:
            for i in range(per_thread):
                log.append("s1", "user_message", {"k": k, "i": i})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                seqs = [e.seq for e in log.events("s1")]
                assert seqs == list(range(1, len(seqs) + 1)), "a reader saw a gap"
                row = log.session("s1")
                assert row["events"] == row["last_seq"]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(k,)) for k in range(n_threads)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    events = log.events("s1")
    assert [e.seq for e in events] == list(range(1, n_threads * per_thread + 2))
    for k in range(n_threads):  # each thread's events in its own order
        assert [e.payload["i"] for e in events if e.payload.get("k") == k] == list(range(per_thread))


@pytest.mark.asyncio
async def test_concurrent_async_appends(log):
    new(log)
    done = await asyncio.gather(*(log.aappend("s1", "user_message", {"i": i}) for i in range(50)))
    assert sorted(e.seq for e in done) == list(range(2, 52))


# -- closing ------------------------------------------------------------------------------


def test_close_finishes_pending_writes_then_refuses(make_log):
    log = make_log()
    new(log)
    gate = threading.Event()
    slow = log.write(lambda tx: (gate.wait(10), tx.append("s1", "user_message", {"text": "queued"}))[1])
    queued = log.write(lambda tx: tx.append("s1", "user_message", {"text": "queued too"}))
    closer = threading.Thread(target=log.close)
    closer.start()
    gate.set()
    closer.join()
    assert slow.result().seq == 2 and queued.result().seq == 3
    with pytest.raises(LogClosed):
        log.append("s1", "user_message", {"text": "late"})
    with pytest.raises(LogClosed):
        log.write(lambda tx: None)
    with pytest.raises(LogClosed):
        log.events("s1")
    with pytest.raises(LogClosed):
        log.sessions()
    with pytest.raises(LogClosed):
        log.has_session("s1")
    log.close()  # twice is fine


# -- group commit ---------------------------------------------------------------------------


def _hold_writer(log):
    """Block the writer thread inside a write until the returned gate is set: what is written meanwhile is queued
    and goes into one group. Returns (gate, the held write's future)."""
    gate, inside = threading.Event(), threading.Event()
    held = log.write(lambda tx: (inside.set(), gate.wait(30), tx.append("s1", "user_message", {"text": "held"}))[2])
    assert inside.wait(30), "the writer never ran the held write"
    return gate, held


def test_writes_queued_during_a_commit_go_into_one_group_and_each_caller_gets_its_own_result(log):
    new(log)
    commits = []
    log.subscribe_commits(lambda events: commits.append([(e.session_id, e.seq) for e in events]))
    gate, held = _hold_writer(log)
    futures = [log.write(lambda tx, i=i: tx.append("s1", "user_message", {"i": i})) for i in range(10)]
    assert not any(f.done() for f in futures)  # nothing is answered before its commit
    gate.set()
    assert held.result(30).seq == 2
    assert [f.result(30).seq for f in futures] == list(range(3, 13))
    assert [f.result().payload["i"] for f in futures] == list(range(10))
    # the held write was its own commit; the ten queued meanwhile were committed together
    assert commits == [[("s1", 2)], [("s1", s) for s in range(3, 13)]]


def test_a_failing_write_in_a_group_fails_alone_and_is_never_announced(log):
    new(log)
    heard, commits = [], []
    log.subscribe(lambda ev: heard.append(ev.seq))
    log.subscribe_commits(lambda events: commits.append([e.seq for e in events]))
    gate, held = _hold_writer(log)
    ok1 = log.write(lambda tx: tx.append("s1", "user_message", {"text": "before"}))
    bad = log.write(lambda tx: (tx.append("s1", "user_message", {"text": "rolled back"}), boom(RuntimeError("bad write")))[0])
    refused = log.write(lambda tx: tx.append("s1", "no_such_type", {}))
    ok2 = log.write(lambda tx: tx.append("s1", "user_message", {"text": "after"}))
    gate.set()
    held.result(30)
    with pytest.raises(RuntimeError, match="bad write"):
        bad.result(30)
    with pytest.raises(UnknownEventType):
        refused.result(30)
    assert (ok1.result(30).seq, ok2.result(30).seq) == (3, 4)
    assert [(e.seq, e.payload.get("text")) for e in log.events("s1")] == [(1, None), (2, "held"), (3, "before"), (4, "after")]
    assert heard == [2, 3, 4]  # only committed events, each once, in order
    assert commits == [[2], [3, 4]]
    assert log.session("s1")["events"] == 4


def test_a_write_that_fails_in_a_group_hears_it_after_the_writes_before_it_are_committed(log):
    """An optimistic writer (plan from a read, refuse in the write when what it read changed, plan again) retries
    when it hears its failure: by then the write that made it fail must be readable, or its next plan reads the
    old state again and fails on the same change (a memory-tool edit lost to 'changed 8 times' under load)."""
    new(log)
    gate, held = _hold_writer(log)
    first = log.write(lambda tx: tx.append("s1", "user_message", {"text": "first"}))
    refused = log.write(lambda tx: boom(RuntimeError("what I read changed")))
    seen_then, called = [], threading.Event()

    def heard(_):  # run as the caller hears the failure (on the writer thread, before it goes on)
        seen_then.append([e.payload.get("text") for e in log.events("s1")])
        called.set()

    refused.add_done_callback(heard)
    gate.set()
    held.result(30)
    with pytest.raises(RuntimeError, match="what I read changed"):
        refused.result(30)
    assert first.result(30).seq == 3
    assert called.wait(30)
    assert seen_then == [[None, "held", "first"]]


def test_a_group_whose_commit_fails_announces_nothing_and_commits_each_write_alone(log):
    new(log)
    heard = []
    log.subscribe(lambda ev: heard.append(ev.seq))
    real_commit = log._commit
    failed = []

    def commit(tx):
        if len(tx.appended) > 1 and not failed:  # the first group commit fails, as a full disk would
            failed.append(len(tx.appended))
            raise OSError("simulated commit failure")
        real_commit(tx)

    log._commit = commit
    gate, held = _hold_writer(log)
    futures = [log.write(lambda tx, i=i: tx.append("s1", "user_message", {"i": i})) for i in range(5)]
    gate.set()
    held.result(30)
    assert [f.result(30).seq for f in futures] == [3, 4, 5, 6, 7]
    assert failed == [5]
    assert heard == [2, 3, 4, 5, 6, 7]
    assert [e.payload.get("i") for e in log.events("s1")][2:] == [0, 1, 2, 3, 4]
    assert log.session("s1")["events"] == 7


def test_a_lone_write_whose_commit_fails_gets_the_error_and_nothing_is_kept(log):
    new(log)
    heard = []
    log.subscribe(lambda ev: heard.append(ev.seq))
    real_commit = log._commit

    def commit(tx):
        raise OSError("simulated commit failure")

    log._commit = commit
    with pytest.raises(OSError, match="simulated"):
        log.append("s1", "user_message", {"text": "lost"})
    log._commit = real_commit
    assert log.append("s1", "user_message", {"text": "kept"}).seq == 2
    assert heard == [2] and [e.seq for e in log.events("s1")] == [1, 2]


def test_commit_before_notify_under_concurrent_appenders(log):
    """Every subscriber call finds its event (and every earlier one) readable, with 20 threads appending at once."""
    sids = [f"s{k}" for k in range(20)]
    for sid in sids:
        new(log, sid)
    problems, heard = [], collections.defaultdict(list)

    def on_commit(events):
        for e in events:
            if [x.seq for x in log.events(e.session_id, after=e.seq - 1, until=e.seq)] != [e.seq]:
                problems.append(("not readable when announced", e.session_id, e.seq))
            heard[e.session_id].append(e.seq)

    log.subscribe_commits(on_commit)
    answered = collections.defaultdict(list)

    def appender(sid):
        for i in range(15):
            e = log.append(sid, "user_message", {"i": i})
            if e.seq not in heard[sid]:  # answered only after it was announced
                problems.append(("answered before announced", sid, e.seq))
            answered[sid].append(e.seq)

    threads = [threading.Thread(target=appender, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert problems == []
    for sid in sids:
        assert answered[sid] == heard[sid] == list(range(2, 17))


def test_a_cancelled_queued_write_is_not_run(log):
    new(log)
    gate, held = _hold_writer(log)
    cancelled = log.write(lambda tx: tx.append("s1", "user_message", {"text": "cancelled"}))
    kept = log.write(lambda tx: tx.append("s1", "user_message", {"text": "kept"}))
    assert cancelled.cancel()
    gate.set()
    assert held.result(30).seq == 2 and kept.result(30).seq == 3
    assert [e.payload.get("text") for e in log.events("s1")][1:] == ["held", "kept"]


# -- the sessions summary ----------------------------------------------------------------------


def recomputed(log) -> list[dict]:
    """What each session's row must say, computed from its events alone."""
    out = []
    for r in log.sessions():
        events = log.events(r["id"])
        marks = [e.type for e in events if e.type in ("user_message", "turn_ended")]
        out.append({**r, "events": len(events), "last_seq": events[-1].seq if events else 0,
                    "last_type": events[-1].type if events else None,
                    "updated_at": (events[-1].ts.isoformat() if events else r["created_at"]),
                    "state": {None: "new", "turn_ended": "ended", "user_message": "unfinished"}[marks[-1] if marks else None]})
    return out


def test_the_summary_always_agrees_with_the_events(log):
    import random

    rnd = random.Random(12)
    for k in range(6):
        new(log, f"s{k}", title=f"Title {k}", kind="dream" if k % 3 == 0 else "chat")
    types = ["user_message", "assistant_turn", "tool_started", "tool_result", "turn_ended", "hands_stopped"]

    def payload(t):
        return {"message": VERBATIM} if t == "assistant_turn" else {"text": "x"}

    def appender(seed):
        r = random.Random(seed)
        for _ in range(30):
            sid, t = f"s{r.randrange(6)}", r.choice(types)
            if r.random() < 0.15:  # a write that fails: nothing of it may reach the summary
                with pytest.raises(RuntimeError):
                    log.write(lambda tx, sid=sid, t=t: (tx.append(sid, t, payload(t)), boom(RuntimeError("no")))).result()
            elif r.random() < 0.2:
                log.write(lambda tx, sid=sid, t=t: [tx.append(sid, t, payload(t)), tx.append(f"s{(int(sid[1:]) + 1) % 6}", t, payload(t))]).result()
            else:
                log.append(sid, t, payload(t))

    threads = [threading.Thread(target=appender, args=(rnd.random(),)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert log.sessions() == recomputed(log)
    assert sum(r["events"] for r in log.sessions()) > 6


def test_sessions_filters_and_pages(log):
    for i in range(7):
        new(log, f"s{i}", title=f"About {'PRICES' if i % 2 else 'weather'} {i}", kind="dream" if i == 3 else "chat")
    log.append("s1", "user_message", {"text": "x"})
    log.append("s2", "user_message", {"text": "x"})
    log.append("s2", "turn_ended", {"stop_reason": "end_turn"})
    log.append("s5", "user_message", {"text": "x"})
    ids = lambda rows: [r["id"] for r in rows]  # noqa: E731
    assert ids(log.sessions(state="unfinished")) == ["s1", "s5"]
    assert ids(log.sessions(state="ended")) == ["s2"]
    assert ids(log.sessions(state="new", kind="chat")) == ["s0", "s4", "s6"]
    assert ids(log.sessions(text="prices")) == ["s1", "s3", "s5"]
    assert ids(log.sessions(text="Prices", kind="chat", state="unfinished")) == ["s1", "s5"]
    assert log.sessions(text="nothing like it") == []
    assert ids(log.sessions(order="-created"))[:3] == ["s6", "s5", "s4"]
    assert ids(log.sessions(order="-updated"))[:3] == ["s5", "s2", "s1"]
    s2 = log.session("s2")["updated_at"]
    assert ids(log.sessions(updated_after=s2)) == ["s5"]
    assert "s2" not in ids(log.sessions(updated_before=s2)) and "s1" in ids(log.sessions(updated_before=s2))
    assert ids(log.sessions(updated_after=datetime.fromisoformat(s2).astimezone(UTC))) == ["s5"]
    # cursor pages: every session once, in order, for every order
    for order in ("created", "-created", "updated", "-updated"):
        seen, cursor = [], None
        while True:
            page = log.sessions_page(limit=3, order=order, cursor=cursor)
            seen += ids(page["sessions"])
            cursor = page["next"]
            if cursor is None:
                break
        assert seen == ids(log.sessions(order=order)) and len(seen) == 7
    page = log.sessions_page(limit=2, kind="chat", text="prices")
    assert ids(page["sessions"]) == ["s1", "s5"] and page["next"] is None
    # a page fetched, then a session changed: the next page still starts after the last row seen
    first = log.sessions_page(limit=3, order="-created")
    new(log, "s7", title="newest")
    rest = log.sessions_page(limit=10, order="-created", cursor=first["next"])
    assert ids(first["sessions"]) + ids(rest["sessions"]) == ["s6", "s5", "s4", "s3", "s2", "s1", "s0"]


@pytest.mark.parametrize("kw", [
    {"state": "running"}, {"state": 1}, {"order": "newest"}, {"limit": 0}, {"limit": 10**6}, {"limit": True},
    {"limit": "5"}, {"cursor": "garbage"}, {"cursor": "x" * 10000}, {"cursor": 5}, {"updated_after": "yesterday"},
    {"updated_before": float("nan")}, {"text": 5}, {"ids": "s1"},
])
def test_bad_listing_arguments_are_refused_clearly(log, kw):
    new(log)
    with pytest.raises(ValueError) as e:
        log.sessions_page(**{"limit": 5, **kw})
    assert any(name in str(e.value) for name in kw)


def test_a_cursor_of_another_order_is_refused(log):
    for i in range(3):
        new(log, f"s{i}")
    cursor = log.sessions_page(limit=1, order="created")["next"]
    with pytest.raises(ValueError, match="cursor"):
        log.sessions_page(limit=1, order="-updated", cursor=cursor)


def test_hostile_listing_text_matches_nothing_and_breaks_nothing(log):
    new(log, title="50% off_sale \\ 'quoted'")
    assert [r["id"] for r in log.sessions(text="50% off_")] == ["s1"]
    assert [r["id"] for r in log.sessions(text="'quoted'")] == ["s1"]
    assert log.sessions(text="%") == log.sessions(text="50%")
    assert log.sessions(text="\ud800") == [] and log.sessions(text="_x") == []
    assert log.sessions(text="") == log.sessions()  # empty text filters nothing


# -- scrubbing: the one exception to append-only -----------------------------------------


SECRET = "ghp_Scrub5ecretT0ken9876543210abcdefXYZ"


def test_scrub_replaces_every_copy_in_place_and_says_where(log):
    new(log, "a", title=f"about {SECRET}", payload={"system": f"# Memories\n\nuse {SECRET} to deploy", "tools": []})
    new(log, "b")
    turn = {"message": {"role": "assistant", "content": [
        {"type": "thinking", "thinking": f"the token is {SECRET}", "signature": "sig-a"},
        {"type": "thinking", "thinking": "nothing secret", "signature": "sig-b"},
        {"type": "text", "text": f"Using {SECRET}."},
        {"type": "tool_use", "id": "t1", "name": "propose_memory", "input": {"text": f"deploy with {SECRET}", "n": [1, {"x": SECRET}]}}]}}
    log.append("a", "assistant_turn", turn)
    log.append("a", "user_message", {"text": "nothing to see"})
    log.append("b", "tool_result", {"tool_use_id": "t9", "content": [{"type": "text", "text": f"read: ünï {SECRET}"}]})
    before = snapshot(log)

    def scrub_then_fail(tx):
        assert tx.scrub([SECRET], "[redacted]")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        log.write(scrub_then_fail).result()
    assert snapshot(log) == before  # a scrub is part of its transaction: rolled back with it

    def scrub(tx):
        out = tx.scrub([SECRET, "", "deploy with " + SECRET], "[redacted]")
        tx.append("b", "user_message", {"text": f"appended in the same transaction: {SECRET}"})
        return out

    touched = log.write(scrub).result()
    assert touched == {"a": [1, 2], "b": [2]}
    everything = repr(snapshot(log)) + repr(log.sessions())
    assert SECRET not in everything.replace(f"appended in the same transaction: {SECRET}", "")
    assert log.session("a")["title"] == "about [redacted]"
    a = log.events("a")
    assert a[0].payload["system"] == "# Memories\n\nuse [redacted] to deploy"
    content = a[1].payload["message"]["content"]
    # the thinking that held it is gone with its signature; the rest keeps its shape
    assert [b["type"] for b in content] == ["thinking", "text", "tool_use"] and content[0]["signature"] == "sig-b"
    assert content[2]["input"] == {"text": "[redacted]", "n": [1, {"x": "[redacted]"}]}
    assert a[2].payload == {"text": "nothing to see"}
    assert log.events("b")[1].payload["content"][0]["text"] == "read: ünï [redacted]"
    assert [e.seq for e in log.events("a")] == [1, 2, 3]  # no seq changes, nothing added by the scrub itself
    assert log.write(lambda tx: tx.scrub([SECRET, "absent text"], "[redacted]")).result() == {"b": [3]}
    assert log.write(lambda tx: tx.scrub([], "[redacted]")).result() == {}
    log.compact()  # nothing to do for a log without a file, a rewrite for a file: either way the log still works
    assert log.append("a", "user_message", {"text": "after"}).seq == 4 and SECRET not in repr(snapshot(log))


@pytest.mark.parametrize("target", ['say "hi" \\ then\nnewline\ttab', "ünïcödé 🔑 key-材料-9", "</script><img src=x onerror=alert(1)>",
                                    "\u2028line\u2029sep\x00nul\x1f"])
def test_scrub_finds_texts_json_escapes(log, target):
    new(log, "a", payload={"system": f"before {target} after", "k": {target: target}})
    assert log.write(lambda tx: tx.scrub([target], "[x]")).result() == {"a": [1]}
    # values are scrubbed, keys are not: a payload's shape never changes
    assert log.events("a")[0].payload == {"system": "before [x] after", "k": {target: "[x]"}}
