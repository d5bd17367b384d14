"""Managing sessions, one conformance suite for DuckDBLog and MemoryLog: rename, archive, delete, fork,
search, and the automatic title."""

from __future__ import annotations

import threading

import pytest

from workbench.errors import ConfigError, InvalidPayload, SessionExists, TurnBusy, UnknownSession
from workbench.log import DuckDBLog, MemoryLog
from workbench.log.manage import auto_title, turn_boundary


@pytest.fixture(params=["duckdb", "memory"])
def log(request, tmp_path):
    lg = DuckDBLog(tmp_path / "log.duckdb") if request.param == "duckdb" else MemoryLog()
    yield lg
    lg.close()


def chat(log, sid: str, *turns: str, title: str | None = None, open_last: bool = False) -> None:
    """A session with one finished turn per text (the last left open with open_last)."""
    log.create_session(sid, title=title, model="scripted", payload={"system": "be brief", "model": "scripted"})
    for i, text in enumerate(turns):
        log.append(sid, "user_message", {"text": text})
        log.append(sid, "assistant_turn", {"message": {"content": [
            {"type": "thinking", "thinking": "hidden words", "signature": "s"},
            {"type": "text", "text": f"reply {i} about {text}"},
            {"type": "tool_use", "id": f"t{i}", "name": "python", "input": {"code": "1"}}]}})
        log.append(sid, "tool_started", {"tool_use_id": f"t{i}", "name": "python"})
        if open_last and i == len(turns) - 1:
            return
        log.append(sid, "tool_result", {"tool_use_id": f"t{i}", "name": "python",
                                        "content": [{"type": "text", "text": f"out{i} ünïcode"}]})
        log.append(sid, "turn_ended", {"stop_reason": "end_turn"})


def test_rename_records_an_event_and_changes_the_row(log):
    chat(log, "a", "hi")
    e = log.rename_session("a", "Sine waves ✓")
    assert (e.type, e.payload) == ("session_renamed", {"title": "Sine waves ✓", "previous": None, "auto": False})
    assert log.session("a")["title"] == "Sine waves ✓"
    assert log.rename_session("a", "again", only_untitled=True) is None  # it has a title: nothing written
    assert log.session("a")["title"] == "Sine waves ✓"
    assert log.events("a")[-1].seq == e.seq


@pytest.mark.parametrize("bad", ["", "   \n", "x" * 2_000_000, "a\ud800b", None, 3, ["t"]])
def test_rename_refuses_a_bad_title_and_writes_nothing(log, bad):
    chat(log, "a", "hi")
    before = log.session("a")
    with pytest.raises(InvalidPayload):
        log.rename_session("a", bad)
    assert log.session("a") == before


def test_rename_archive_delete_of_an_unknown_session(log):
    for op in (lambda: log.rename_session("nope", "t"), lambda: log.archive_session("nope"),
               lambda: log.delete_session("nope"), lambda: log.fork_session("nope", new_id="n"),
               lambda: log.rename_session("\ud800", "t")):
        with pytest.raises(UnknownSession):
            op()
    assert log.sessions() == []


def test_archive_hides_from_a_filtered_listing_and_unarchive_brings_back(log):
    chat(log, "a", "hi")
    chat(log, "b", "ho")
    assert log.archive_session("a").payload == {"archived": True}
    assert [s["id"] for s in log.sessions(archived=False)] == ["b"]
    assert [s["id"] for s in log.sessions(archived=True)] == ["a"]
    assert [s["id"] for s in log.sessions()] == ["a", "b"]
    assert log.sessions_page(limit=5, archived=False)["sessions"][0]["id"] == "b"
    log.archive_session("a", False)
    assert [s["id"] for s in log.sessions(archived=False)] == ["a", "b"]
    with pytest.raises(ValueError):
        log.sessions(archived="yes")
    with pytest.raises(ValueError):
        log.archive_session("a", "no")


def test_delete_removes_every_row_and_refuses_while_a_turn_is_open(log):
    chat(log, "a", "one", "two", open_last=True)
    chat(log, "b", "keep")
    n = len(log.events("a"))
    with pytest.raises(TurnBusy):
        log.delete_session("a")
    assert len(log.events("a")) == n  # nothing removed
    # a turn the log shows open but nothing runs (a dead server's): the caller says it is not running
    assert log.delete_session("a", busy=lambda sid: False) == n
    assert not log.has_session("a") and log.events("a") == [] and [s["id"] for s in log.sessions()] == ["b"]
    assert log.search("one")["hits"] == []
    with pytest.raises(UnknownSession):
        log.append("a", "user_message", {"text": "after"})  # no seq of it is remembered
    assert log.events("a") == []
    chat(log, "a", "reborn")  # the id is free again, and its seqs start at 1
    assert [e.seq for e in log.events("a")][:2] == [1, 2]


def test_delete_racing_appends_never_leaves_a_half_log(log):
    chat(log, "a", "one")
    errors: list[BaseException] = []

    def writer() -> None:
        for _ in range(200):
            try:
                log.append("a", "hands_stopped", {})
            except UnknownSession:
                return
            except BaseException as e:  # anything else is a bug
                errors.append(e)
                return

    t = threading.Thread(target=writer)
    t.start()
    log.delete_session("a")
    t.join()
    assert not errors
    assert not log.has_session("a") and log.events("a") == [] and log.sessions() == []


def test_fork_copies_the_prefix_and_names_its_origin(log):
    chat(log, "a", "first", "second", title="Origin")
    events = log.events("a")
    second = next(e.seq for e in events if e.type == "user_message" and e.payload["text"] == "second")
    created = log.fork_session("a", second - 1, new_id="f", title="Edited")
    assert created.payload["forked_from"] == {"session_id": "a", "seq": second - 1}
    assert created.payload["system"] == "be brief"
    copied = log.events("f")
    assert [(e.type, e.payload) for e in copied[1:]] == [(e.type, e.payload) for e in events[1:second - 1]]
    row = log.session("f")
    assert (row["title"], row["model"], row["state"]) == ("Edited", "scripted", "ended")
    assert len(log.events("a")) == len(events)  # the origin is untouched
    whole = log.fork_session("a", new_id="g")  # no seq: the whole log
    assert whole.payload["forked_from"]["seq"] == events[-1].seq
    assert log.session("g")["title"] == "Origin"


def test_fork_inside_a_turn_is_cut_back_to_the_turn_boundary(log):
    chat(log, "a", "first", "second", open_last=True)
    events = log.events("a")
    boundary = max(e.seq for e in events if e.type == "turn_ended")
    for at in range(boundary, events[-1].seq + 1):  # anywhere in the open turn (and on the boundary)
        created = log.fork_session("a", at, new_id=f"f{at}")
        assert created.payload["forked_from"]["seq"] == boundary
        assert log.session(f"f{at}")["state"] == "ended"
    assert turn_boundary(events[:2]) == 1  # inside the first turn: only session_created


def test_fork_refusals_write_nothing(log):
    chat(log, "a", "first")
    last = log.events("a")[-1].seq
    for at, exc in ((last + 1, ConfigError), (0, ValueError), (-1, ValueError), (True, ValueError), ("3", ValueError)):
        with pytest.raises(exc):
            log.fork_session("a", at, new_id="f")
    with pytest.raises(SessionExists):
        log.fork_session("a", new_id="a")
    with pytest.raises(InvalidPayload):
        log.fork_session("a", new_id="f", title="\ud800")
    log.create_session("d", title=None, model="m", kind="dream", payload={})
    with pytest.raises(ConfigError):
        log.fork_session("d", new_id="f")
    assert [s["id"] for s in log.sessions()] == ["a", "d"]


def test_search_finds_titles_and_content_in_any_case_paged(log):
    chat(log, "a", "Plot the SINE wave")
    chat(log, "b", "something else", title="Sine title")
    chat(log, "c", "nothing")
    chat(log, "d", "unrelated")
    got = log.search("sine")
    assert {h["id"]: (h["seq"], h["type"]) for h in got["hits"]} == {"a": (2, "user_message"), "b": (0, None)}
    assert got["next"] is None
    assert log.search("OUT0 ÜNÏ")["hits"] and {h["type"] for h in log.search("out0 ünï")["hits"]} == {"tool_result"}
    assert [h["id"] for h in log.search("reply 0 about nothing")["hits"]] == ["c"]
    assert log.search("hidden words")["hits"] == []  # thinking is not searched
    assert log.search("be brief")["hits"] == []  # nor the system prompt
    assert log.search("\"text\"")["hits"] == []  # nor the JSON around the words
    assert log.search("%")["hits"] == [] and log.search("_")["hits"] == []  # no LIKE wildcards
    first = log.search("reply", limit=2)
    second = log.search("reply", limit=2, cursor=first["next"])
    ids = [h["id"] for h in first["hits"] + second["hits"]]
    assert sorted(ids) == ["a", "b", "c", "d"] and second["next"] is None
    assert "SINE" in got["hits"][0]["snippet"] or "Sine" in got["hits"][0]["snippet"]
    log.archive_session("a")
    assert [h["id"] for h in log.search("sine", archived=False)["hits"]] == ["b"]


def test_search_finds_a_python_result_stored_once_by_the_text_of_its_outputs(log):
    """A python call's result holds its observation alone (no content beside it): its words are its outputs'."""
    chat(log, "a", "hi", open_last=True)
    log.append("a", "tool_result", {"tool_use_id": "t0", "name": "python", "is_error": True, "observation": {
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "Printed-Needle ünï\n"},
                    {"output_type": "display_data", "data": {"text/plain": "Plain-Needle", "text/html": "<b>Html-Only</b>"}},
                    {"output_type": "execute_result", "data": {"text/plain": "Result-Needle"}, "execution_count": 3},
                    {"output_type": "error", "ename": "WeirdError", "evalue": "deep", "traceback": ["tb-only"]}],
        "error": {"ename": "WeirdError", "evalue": "Error-Needle", "traceback": []}, "truncated": [], "notes": [],
        "generation": 1, "duration_ms": 1.0, "text_limit": 20_000, "max_images": 20}})
    for needle in ("printed-needle ÜNÏ", "plain-needle", "result-needle", "weirderror", "error-needle"):
        got = log.search(needle)["hits"]
        assert [(h["id"], h["type"]) for h in got] == [("a", "tool_result")], needle
        assert needle.split()[0].lower() in got[0]["snippet"].lower()
    assert log.search("html-only")["hits"] == [] and log.search("output_type")["hits"] == []


@pytest.mark.parametrize("text, kw", [("", {}), ("  ", {}), ("x" * 201, {}), (None, {}), ("a", {"limit": 0}),
                                      ("a", {"limit": 101}), ("a", {"limit": True}), ("a", {"cursor": "-1"}),
                                      ("a", {"cursor": "x"}), ("a", {"cursor": "١"}), ("a", {"archived": "no"})])
def test_search_refuses_bad_arguments(log, text, kw):
    with pytest.raises(ValueError):
        log.search(text, **kw)


def test_search_with_a_lone_surrogate_matches_nothing(log):
    chat(log, "a", "hi")
    assert log.search("\ud800")["hits"] == []


@pytest.mark.parametrize("text, title", [
    ("Plot a **sine** wave", "Plot a sine wave"),
    ("```python\nimport os\n```\nWhat does this do?", "What does this do?"),
    # the first heading, paragraph or list, not a run-on of the whole message (issue 25, a papercut)
    ("# Heading\n\n- one\n- two", "Heading"),
    ("- load sales.csv\n- plot revenue\n\nThen explain.", "load sales.csv, plot revenue"),
    ("Load the data and clean it.\nKeep it short.\n\nHere is the schema:\n| a | b |", "Load the data and clean it. Keep it short."),
    ("see [the docs](http://x.y) now", "see the docs now"),
    # a message of code only is titled by its code's first line, not left untitled
    ("```\nonly code\n```", "only code"),
    ("```python\n\n# fit the model\nm.fit(X)\n```", "fit the model"),
    ("```python\ndf[df.my_col > 3] * 2\n```", "df[df.my_col > 3] * 2"),
    ("~~~\n\n\n~~~", None),
    ("   \n\t ", None),
    ("a\u202etricky\x00one", "a tricky one"),
    ("word " * 40, "word word word word word word word word word word word…"),
])
def test_auto_title(text, title):
    assert auto_title(text) == title
    if title:
        assert len(title) <= 60 and "\n" not in title


def test_a_sessions_kind_is_read_once_and_forgotten_with_the_session(log):
    chat(log, "a", "hi")
    assert log.session_kind("a") == "chat"
    log.delete_session("a")
    with pytest.raises(UnknownSession):
        log.session_kind("a")
    log.create_session("a", title=None, model="scripted", kind="dream", payload={"system": "x"})
    assert log.session_kind("a") == "dream"  # a new session of the same id: its own kind, not the one known before


def test_naming_an_untitled_session_reads_its_row_only_until_it_has_a_title(log, monkeypatch):
    """The brain names an untitled session after each message it is sent (rename only_untitled): once the log
    knows the session has a title, that costs no read of its row."""
    from workbench.log.writer import WriterTx

    reads = []
    fields = WriterTx.session_fields

    def counted(tx, sid):
        reads.append(sid)
        return fields(tx, sid)

    monkeypatch.setattr(WriterTx, "session_fields", counted)
    chat(log, "a")
    assert log.rename_session("a", "first", auto=True, only_untitled=True).payload["title"] == "first"
    assert len(reads) == 1
    for _ in range(3):
        assert log.rename_session("a", "again", auto=True, only_untitled=True) is None
    assert len(reads) == 1 and log.session("a")["title"] == "first"
    log.delete_session("a")  # a new session of the same id starts untitled
    chat(log, "a")
    assert log.rename_session("a", "second", auto=True, only_untitled=True) is not None
