"""Managing sessions through the REST API: rename, archive, delete, fork, search, usage, models; with hostile
input (every refusal writes nothing) and deletes racing running turns (refused, never a 500 or a half log)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from workbench.log import DuckDBLog

MODEL = "claude-opus-5-5"


async def wait_idle(wb, sid: str) -> dict:
    for _ in range(1200):
        _, row = await wb.call("GET", "sessions", sid, expect=200)
        if not row["running"]:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError("the turn still runs after 60 s")


async def ended_session(wb, text: str = "Plot the **sine** wave\n```python\nx = 1\n```") -> str:
    sid = await wb.session(model="scripted")
    await wb.send(sid, text)
    await wait_idle(wb, sid)
    return sid


async def test_first_message_names_an_untitled_session_and_rename_archive_record_events(wb):
    sid = await ended_session(wb)
    _, row = await wb.call("GET", "sessions", sid, expect=200)
    assert row["title"] == "Plot the sine wave"
    titled = await wb.session(model="scripted", title="Mine")
    await wb.send(titled, "something else")
    await wait_idle(wb, titled)
    assert (await wb.call("GET", "sessions", titled))[1]["title"] == "Mine"  # a given title is kept

    _, row = await wb.call("PATCH", "sessions", sid, body={"title": "Waves ✓ <b>x</b>"}, expect=200)
    assert row["title"] == "Waves ✓ <b>x</b>" and row["archived"] is False
    _, row = await wb.call("PATCH", "sessions", sid, body={"archived": True}, expect=200)
    assert row["archived"] is True
    _, page = await wb.call("GET", "sessions", params={"archived": "false"}, expect=200)
    assert sid not in [s["id"] for s in page["sessions"]]
    _, page = await wb.call("GET", "sessions", params={"archived": "true"}, expect=200)
    assert [s["id"] for s in page["sessions"]] == [sid]
    _, events = await wb.call("GET", "sessions", sid, "events", expect=200)
    kinds = [(e["type"], e["payload"]) for e in events["events"] if e["type"].startswith("session_") and e["seq"] > 1]
    assert kinds == [("session_renamed", {"title": "Plot the sine wave", "previous": None, "auto": True}),
                     ("session_renamed", {"title": "Waves ✓ <b>x</b>", "previous": "Plot the sine wave", "auto": False}),
                     ("session_archived", {"archived": True})]


@pytest.mark.parametrize("body, status", [
    (b"", 400), (b"{}", 400), (b'{"title": ""}', 400), (b'{"title": "   "}', 400), (b'{"title": 3}', 400),
    (b'{"title": null, "archived": null}', 400), (b'{"archived": "true"}', 400), (b'{"archived": 1}', 400),
    (b'{"title": "x", "extra": 1}', 400), (b'{"title": "\\ud800"}', 400), (b'{"title": NaN}', 400),
    (b'\xff\xfe{"title": "x"}', 400), (b'[1]', 400), (b'{"title": {"a": [[[[]]]]}}', 400),
    (b"[" * 100 + b"]" * 100, 400), (json.dumps({"title": "x" * 1001}).encode(), 400),
    (json.dumps({"title": "x" * (2 << 20)}).encode(), 413),
])
async def test_patch_refuses_hostile_bodies_and_writes_nothing(wb, body, status):
    sid = await wb.session(model="scripted", title="kept")
    code, data = await wb.call("PATCH", "sessions", sid, body=body)
    assert code == status and isinstance(data["error"], str), (code, data)
    _, events = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert [e["type"] for e in events["events"]] == ["session_created"]
    assert (await wb.call("GET", "sessions", sid))[1]["title"] == "kept"


async def test_unknown_or_hostile_ids_are_404(wb):
    for sid in ("nope", "x" * 2000, "%E2%80%AE", "a%00b"):
        for method, path, body in (("PATCH", (), {"title": "t"}), ("DELETE", (), None), ("POST", ("fork",), {}),
                                   ("GET", ("usage",), None)):
            code, data = await wb.call(method, "sessions", sid, *path, body=body)
            assert code == 404 and isinstance(data["error"], str), (method, sid, code, data)


async def test_delete_removes_the_session_and_its_events(wb, wb_db):
    sid = await ended_session(wb)
    keep = await ended_session(wb, "keep me")
    _, out = await wb.call("DELETE", "sessions", sid, expect=200)
    assert out["deleted"] == sid and out["events"] > 3
    assert (await wb.call("GET", "sessions", sid))[0] == 404
    assert (await wb.call("GET", "sessions", sid, "events"))[0] == 404
    assert (await wb.call("DELETE", "sessions", sid))[0] == 404
    _, page = await wb.call("GET", "sessions", expect=200)
    assert [s["id"] for s in page["sessions"]] == [keep]
    _, res = await wb.call("POST", "query", body={"sql": "SELECT count(*) FROM events WHERE session_id = ?",
                                                  "params": [sid]}, expect=200)
    assert res["rows"] == [[0]]
    code, _ = await wb.call("POST", "sessions", sid, "messages", body={"text": "hello?"})
    assert code == 404


async def test_deleting_during_a_running_turn_is_refused_and_the_log_stays_whole(wb, fake_api, wb_db):
    api = fake_api("default")
    api.chunk_delay = 0.05
    for _ in range(3):
        sid = await wb.session(model=MODEL)
        racers = [wb.call("POST", "sessions", sid, "messages", body={"text": "a long turn"}),
                  *(wb.call("DELETE", "sessions", sid) for _ in range(3)),
                  wb.call("PATCH", "sessions", sid, body={"title": "renamed mid-turn"})]
        answers = await asyncio.gather(*racers)
        for code, data in answers:
            assert code < 500, (code, data)
        deleted = [c for c, _ in answers[1:4] if c == 200]
        assert len(deleted) <= 1
        if answers[0][0] == 202:  # the turn started: no delete may have removed it under the turn
            await wait_idle(wb, sid)
            assert not deleted
            code, data = await wb.call("DELETE", "sessions", sid)  # once it ended: deleted
            assert code == 200, (code, data)
        assert (await wb.call("GET", "sessions", sid))[0] == 404
    code, data = await wb.call("POST", "query", body={"sql": "SELECT count(*) FROM events"}, expect=200)
    assert data["rows"] == [[0]]  # no event of any deleted session is left behind


async def test_fork_copies_a_prefix_and_edit_and_resend_works(wb):
    sid = await ended_session(wb, "first question")
    await wb.send(sid, "second question")
    await wait_idle(wb, sid)
    _, events = await wb.call("GET", "sessions", sid, "events", expect=200)
    second = next(e["seq"] for e in events["events"] if e["type"] == "user_message" and e["payload"]["text"] == "second question")
    code, row = await wb.call("POST", "sessions", sid, "fork", body={"seq": second - 1, "title": "edited"})
    assert code == 201 and row["title"] == "edited" and row["state"] == "ended", (code, row)
    _, copied = await wb.call("GET", "sessions", row["id"], "events", expect=200)
    first = copied["events"][0]
    assert first["payload"]["forked_from"] == {"session_id": sid, "seq": second - 1}
    assert "second question" not in json.dumps(copied)
    await wb.send(row["id"], "second question, edited")
    await wait_idle(wb, row["id"])
    _, after = await wb.call("GET", "sessions", row["id"], "events", expect=200)
    assert after["events"][-1]["type"] == "turn_ended"
    for body in ({"seq": 0}, {"seq": 10**6}, {"seq": "1"}, {"seq": 1.5}, {"id": "bad id"}, {"id": sid}, {"x": 1}):
        code, data = await wb.call("POST", "sessions", sid, "fork", body=body)
        assert code in (400, 409) and isinstance(data["error"], str), (body, code, data)


async def test_search_routes(wb):
    a = await ended_session(wb, "Tell me about PARQUET files")
    await ended_session(wb, "unrelated")
    _, got = await wb.call("GET", "search", params={"q": "parquet"}, expect=200)
    assert [h["id"] for h in got["hits"]] == [a] and "PARQUET" in got["hits"][0]["snippet"]
    assert got["hits"][0]["running"] is False
    for params in ({}, {"q": ""}, {"q": "x" * 201}, {"q": "x", "limit": "0"}, {"q": "x", "limit": "101"},
                   {"q": "x", "cursor": "-1"}, {"q": "x", "archived": "yes"}, {"q": "x", "other": "1"}):
        code, data = await wb.call("GET", "search", params=params)
        assert code == 400 and isinstance(data["error"], str), (params, code, data)
    _, got = await wb.call("GET", "search", params={"q": "%_"}, expect=200)  # no LIKE wildcards
    assert got["hits"] == []


async def test_usage_and_models(wb, fake_api):
    fake_api("default")
    sid = await wb.session(model=MODEL)
    await wb.send(sid, "hello")
    await wait_idle(wb, sid)
    _, usage = await wb.call("GET", "sessions", sid, "usage", expect=200)
    assert len(usage["turns"]) == 1 and usage["total"]["calls"] >= 1
    assert usage["total"]["output_tokens"] == usage["turns"][0]["output_tokens"] > 0
    assert usage["priced"] is False and usage["total"]["cost"] == 0  # no price table set
    _, models = await wb.call("GET", "models", expect=200)
    assert models["models"][0]["default"] is True and models["models"][0]["name"] == models["default"]
    assert any(m["name"] == "scripted" and m["thinking"] == [] for m in models["models"])


async def test_while_the_models_api_is_slow_to_list_the_server_answers_other_requests(wb, fake_api):
    """With a key, the first GET /models asks the Models API; the server's loop is not held while it waits."""
    api = fake_api({"claude-opus-5-5": "default", "claude-haiku-5-5": "default"})
    api.delay = 8.0
    models = asyncio.ensure_future(wb.call("GET", "models", expect=200))
    deadline = time.monotonic() + 60
    while api.model_lists == 0 and not models.done():  # the server is asking the Models API now
        assert time.monotonic() < deadline, "the server never asked the Models API"
        await asyncio.sleep(0.05)
    await wb.call("GET", "status", expect=200)
    assert not models.done(), "the status waited for the model listing"
    _, got = await models
    assert {"claude-haiku-5-5", "claude-opus-5-5"} <= {m["name"] for m in got["models"]}, got


def test_usage_is_priced_by_the_prices_setting(tmp_path, monkeypatch):
    from workbench.usage import Prices, session_usage

    with DuckDBLog(tmp_path / "u.duckdb") as log:
        log.create_session("s", title=None, model=MODEL, payload={"model": MODEL})
        for n in (1, 2):
            log.append("s", "user_message", {"text": f"q{n}"})
            log.append("s", "assistant_turn", {"message": {"model": MODEL, "content": []},
                                               "usage": {"input_tokens": 1_000_000 * n, "output_tokens": 100_000,
                                                         "cache_read_input_tokens": 0}})
            log.append("s", "turn_ended", {"stop_reason": "end_turn"})
        got = session_usage(log.events("s"), Prices.parse("claude-*=5/25"))
    assert [t["cost"] for t in got["turns"]] == [7.5, 12.5] and got["total"]["cost"] == 20.0 and got["priced"]
