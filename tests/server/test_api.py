"""The REST and websocket API against a real in-process server, real kernels and the fake Messages API."""

from __future__ import annotations

import os
import signal

from wbsrv import read_until, turn_ended

from workbench.render import result_blocks
from workbench.testing import Reply

MODEL = "claude-opus-5-5"


async def test_turn_streams_in_order_and_reconnect_misses_nothing(wb, fake_api):
    api = fake_api([Reply(thinking="", text="I'll compute it.", code=["print(6 * 7)"]), Reply(text="The answer is 42.")])
    sid = await wb.session(title="t", model=MODEL)
    ws = await wb.stream(sid)
    seq = await wb.send(sid, "what is 6*7?")
    deltas: list = []
    # read part of the turn, drop the connection, reconnect with `after`
    first = await read_until(ws, lambda e: e["type"] == "tool_started", deltas)
    ws.close()
    ws2 = await wb.stream(sid, after=first[-1]["seq"])
    rest = await read_until(ws2, turn_ended, deltas)
    seen = [e["seq"] for e in first + rest]
    assert seen == list(range(1, len(seen) + 1))
    assert [e["type"] for e in first][:2] == ["session_created", "user_message"] and first[1]["seq"] == seq
    assert rest[-1]["payload"]["stop_reason"] == "end_turn"
    results = [e for e in first + rest if e["type"] == "tool_result"]
    assert len(results) == 1 and "42" in result_blocks(results[0]["payload"])[0]["text"]
    texts = "".join(d["event"]["delta"].get("text", "") for d in deltas if d["event"]["type"] == "content_block_delta")
    assert "The answer is 42." in texts and all(d["session_id"] == sid for d in deltas)
    assert len(api.requests) == 2

    # the REST view agrees, and a reconnect in the middle gets exactly the rest
    _, page = await wb.call("GET", "sessions", sid, "events", params={"after": "0"}, expect=200)
    assert [e["seq"] for e in page["events"]] == seen and page["last_seq"] == seen[-1]
    _, page = await wb.call("GET", "sessions", sid, "events", params={"after": "2", "limit": "2"}, expect=200)
    assert [e["seq"] for e in page["events"]] == [3, 4] and page["last_seq"] == 4
    ws3 = await wb.stream(sid, after=3)
    again = await read_until(ws3, turn_ended)
    assert [e["seq"] for e in again] == seen[3:]
    # the next thing on that connection is the next turn's first event: nothing twice, nothing skipped
    await wb.send(sid, "thanks")
    nxt = await read_until(ws3, turn_ended)
    assert nxt[0]["seq"] == seen[-1] + 1 and nxt[0]["type"] == "user_message"
    ws2.close()
    ws3.close()
    _, s = await wb.call("GET", "sessions", sid, expect=200)
    assert s["running"] is False and s["last_type"] == "turn_ended" and s["model"] == MODEL


async def test_killing_the_hands_mid_turn_gets_a_fresh_kernel(wb, fake_api):
    fake_api([
        Reply(text="A long computation.", code=["import time\nprint('sleeping', flush=True)\ntime.sleep(120)"]),
        Reply(text="My kernel died; again, in a fresh one.", code=["print('fresh')"]),
        Reply(text="Done in the new kernel."),
    ])
    sid = await wb.session(model=MODEL)
    ws = await wb.stream(sid)
    await wb.send(sid, "compute")
    await read_until(ws, lambda e: e["type"] == "hands_started")
    _, hands = await wb.call("GET", "sessions", sid, "hands", expect=200)
    assert hands["pid"] and hands["generation"] == 1
    os.kill(hands["pid"], signal.SIGKILL)
    events = await read_until(ws, turn_ended)
    types = [e["type"] for e in events]
    assert "hands_died" in types and events[-1]["payload"]["stop_reason"] == "end_turn"
    died, fresh = [e for e in events if e["type"] == "tool_result"]
    assert died["payload"]["is_error"] and "died" in result_blocks(died["payload"])[0]["text"]
    assert "fresh" in result_blocks(fresh["payload"])[0]["text"] and not fresh["payload"]["is_error"]
    started = [e for e in events if e["type"] == "hands_started"]
    assert [e["payload"]["generation"] for e in started] == [2]
    assert types.index("hands_died") < types.index("hands_started")
    # a restart on request replaces the kernel and says so in the log
    _, hands = await wb.call("POST", "sessions", sid, "hands", "restart", expect=200)
    assert hands["generation"] == 3 and hands["state"] == "idle"
    restarted = await read_until(ws, lambda e: e["type"] == "hands_restarted")
    assert restarted[-1]["payload"]["by"] == "api"
    ws.close()


async def test_unauthenticated_requests_get_403(wb, jp_fetch, jp_ws_fetch):
    from tornado.httpclient import HTTPClientError

    sid = await wb.session(model="scripted")
    anon = {"Authorization": ""}
    for method, path, body in [
        ("GET", ("sessions",), None),
        ("POST", ("sessions",), "{}"),
        ("GET", ("sessions", sid), None),
        ("POST", ("sessions", sid, "messages"), '{"text": "hi"}'),
        ("GET", ("sessions", sid, "events"), None),
        ("POST", ("sessions", sid, "interrupt"), "{}"),
        ("GET", ("sessions", sid, "hands"), None),
        ("POST", ("sessions", sid, "hands", "restart"), "{}"),
        ("POST", ("query",), '{"sql": "SELECT 1"}'),
        ("GET", ("status",), None),
    ]:
        try:
            await jp_fetch("workbench", "api", *path, method=method, body=body, headers=dict(anon))
            raise AssertionError(f"{method} {path} answered without auth")
        except HTTPClientError as e:
            assert e.code == 403, (method, path, e.code)
    try:
        await jp_ws_fetch("workbench", "api", "sessions", sid, "stream", headers=dict(anon))
        raise AssertionError("the stream opened without auth")
    except HTTPClientError as e:
        assert e.code == 403
    # nothing was written by the refused requests
    _, page = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert [e["type"] for e in page["events"]] == ["session_created"]


async def test_bad_input_gets_4xx_json_and_writes_nothing(wb):
    sid = await wb.session(model="scripted")
    cases = [
        ("POST", ("sessions",), "not json", 400),
        ("POST", ("sessions",), "[1, 2]", 400),
        ("POST", ("sessions",), {"title": 5}, 400),
        ("POST", ("sessions",), {"titel": "typo"}, 400),
        ("POST", ("sessions",), {"model": "no-such-model"}, 400),
        ("POST", ("sessions",), {"config": {"thinking": "loud"}}, 400),
        ("POST", ("sessions",), {"config": {"hands": {"timeout": "soon"}}}, 400),
        ("POST", ("sessions",), {"config": {"hands": {"gpu": True}}}, 400),
        ("POST", ("sessions",), {"tools": ["no_such_tool"]}, 400),
        ("POST", ("sessions", sid, "messages"), {}, 400),
        ("POST", ("sessions", sid, "messages"), {"text": "   "}, 400),
        ("POST", ("sessions", sid, "messages"), "{oops", 400),
        ("POST", ("sessions", "nope", "messages"), {"text": "hi"}, 404),
        ("GET", ("sessions", "nope"), None, 404),
        ("GET", ("sessions", "nope", "events"), None, 404),
        ("GET", ("sessions", "nope", "hands"), None, 404),
        ("POST", ("sessions", "nope", "interrupt"), {}, 404),
        ("POST", ("query",), {"sql": "DELETE FROM events"}, 400),
        ("POST", ("query",), {"sql": "SELECT * FROM no_such_table"}, 400),
        ("POST", ("query",), {"sql": "SELECT 1", "params": "x"}, 400),
    ]
    for method, path, body, status in cases:
        code, data = await wb.call(method, *path, body=body)
        assert code == status, (path, body, code, data)
        assert isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"], (path, data)
    code, data = await wb.call("GET", "sessions", sid, "events", params={"after": "abc"})
    assert code == 400 and "after" in data["error"]
    _, listing = await wb.call("GET", "sessions", expect=200)
    assert [s["id"] for s in listing["sessions"]] == [sid]
    _, page = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert [e["type"] for e in page["events"]] == ["session_created"]
    _, q = await wb.call("POST", "query", body={"sql": "SELECT count(*) AS n FROM events WHERE session_id = ?", "params": [sid]}, expect=200)
    assert q == {"columns": ["n"], "rows": [[1]], "truncated": False}
    _, status = await wb.call("GET", "status", expect=200)
    assert status["sessions_running"] == 0 and status["db"].endswith("wb.duckdb")


async def test_ten_sessions_at_once_and_a_slow_one_blocks_nobody(wb):
    slow = await wb.session(model="scripted", title="slow")
    slow_ws = await wb.stream(slow)
    await wb.send(slow, "```python\nimport time\ntime.sleep(300)\n```")
    await read_until(slow_ws, lambda e: e["type"] == "tool_started")
    sids = [await wb.session(model="scripted", title=f"s{i}") for i in range(10)]
    streams = [await wb.stream(s) for s in sids]
    for i, s in enumerate(sids):
        await wb.send(s, f"```python\nprint('session', {i})\n```")
    for i, ws in enumerate(streams):
        events = await read_until(ws, turn_ended)
        assert events[-1]["payload"]["stop_reason"] == "end_turn"
        assert f"session {i}" in result_blocks(next(e for e in events if e["type"] == "tool_result")["payload"])[0]["text"]
        ws.close()
    pids = set()
    for s in sids:
        _, h = await wb.call("GET", "sessions", s, "hands", expect=200)
        pids.add(h["pid"])
    assert len(pids) == 10  # each session has hands of its own
    # the slow one is still running all along; a second message is refused, an interrupt ends it
    _, s = await wb.call("GET", "sessions", slow, expect=200)
    assert s["running"] is True
    code, data = await wb.call("POST", "sessions", slow, "messages", body={"text": "hello?"})
    assert code == 409 and "running" in data["error"]
    _, r = await wb.call("POST", "sessions", slow, "interrupt", expect=200)
    assert r == {"interrupted": True}
    events = await read_until(slow_ws, turn_ended)
    assert events[-1]["payload"]["stop_reason"] == "interrupted"
    assert any(e["type"] == "interrupted" for e in events)
    _, r = await wb.call("POST", "sessions", slow, "interrupt", expect=200)
    assert r == {"interrupted": False}
    slow_ws.close()


async def test_a_cut_off_turn_is_refused_new_messages_until_resumed(wb, jp_serverapp):
    runtime = jp_serverapp.web_app.settings["workbench_runtime"]
    sid = await wb.session(model="scripted")
    # what a dead server leaves behind: a user message and no end of the turn
    runtime.log.append(sid, "user_message", {"text": "hello from before the crash"})
    code, data = await wb.call("POST", "sessions", sid, "messages", body={"text": "and again"})
    assert code == 409 and "unfinished turn" in data["error"]
    ws = await wb.stream(sid, after=2)
    _, r = await wb.call("POST", "sessions", sid, "resume", expect=202)
    assert r == {"resumed": True}
    events = await read_until(ws, turn_ended)
    assert events[0]["type"] == "resumed" and events[-1]["payload"]["stop_reason"] == "end_turn"
    assert "hello from before the crash" in events[-2]["payload"]["message"]["content"][-1]["text"]
    _, r = await wb.call("POST", "sessions", sid, "resume", expect=202)
    assert r == {"resumed": False}
    assert await runtime.service.wake() == []  # nothing left to wake
    ws.close()


async def test_restarting_busy_hands_ends_the_running_call_like_a_kernel_death(wb):
    sid = await wb.session(model="scripted")
    ws = await wb.stream(sid)
    await wb.send(sid, "```python\nimport time\ntime.sleep(120)\n```")
    await read_until(ws, lambda e: e["type"] == "hands_started")
    await wb.call("POST", "sessions", sid, "hands", "restart", expect=200)
    events = await read_until(ws, turn_ended)
    restarted = next(e for e in events if e["type"] == "hands_restarted")
    assert restarted["payload"]["killed_busy"] is True
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["payload"]["is_error"] and "died" in result_blocks(result["payload"])[0]["text"]
    assert events[-1]["payload"]["stop_reason"] == "end_turn"
    ws.close()


async def test_a_session_as_a_notebook_over_rest(wb, fake_api):
    """GET /sessions/{id}/notebook: the session's code and outputs as a valid nbformat 4 notebook; the same
    as the CLI builds; a JSON 404 for an unknown or hostile id, and nothing written."""
    import nbformat

    fake_api([Reply(thinking="", text="Computing.", code=["print(6 * 7)"]), Reply(text="42.")])
    sid = await wb.session(title="nb <script>", model=MODEL)
    ws = await wb.stream(sid)
    await wb.send(sid, "what is 6*7?")
    await read_until(ws, turn_ended)
    _, nb = await wb.call("GET", "sessions", sid, "notebook", expect=200)
    nbformat.validate(nbformat.from_dict(nb))
    (code,) = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code["source"] == "print(6 * 7)" and code["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "42\n"}]
    _, before = await wb.call("GET", "sessions", sid, "events", expect=200)
    for bad in ("nope", "%FF", "a" * 300, "..%2F..", "%00"):
        status, body = await wb.call("GET", "sessions", bad, "notebook")
        assert status in (400, 404) and isinstance(body, dict) and "error" in body, (bad, status, body)
    _, after = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert after == before
