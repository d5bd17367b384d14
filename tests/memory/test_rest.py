"""The memory and dream routes against a real in-process Jupyter server (pytest-jupyter's runner, not pytest-asyncio)."""

from __future__ import annotations

import json

from tornado.httpclient import HTTPClientError

API = ("workbench", "api")


async def call(jp_fetch, method, *path, body=None, params=None):
    kw = {"method": method, "params": params}
    if body is not None:
        kw["body"] = json.dumps(body)
    try:
        r = await jp_fetch(*API, *path, **kw)
        return r.code, json.loads(r.body or b"null")
    except HTTPClientError as e:
        return e.code, json.loads(e.response.body) if e.response is not None and e.response.body else None


async def until_event(jp_ws_fetch, session_id: str, type_: str, after: int = 0) -> None:
    """Follow the session's stream (from `after`) until an event of `type_` comes."""
    ws = await jp_ws_fetch(*API, "sessions", session_id, "stream", params={"after": str(after)})
    try:
        while True:
            msg = json.loads(await ws.read_message())
            if msg["kind"] == "event" and msg["event"]["type"] == type_:
                return
    finally:
        ws.close()


async def dream_to_the_end(jp_fetch, jp_ws_fetch, body):
    code, started = await call(jp_fetch, "POST", "dreams", body=body)
    assert code == 202 and started["state"] == "running", started
    await until_event(jp_ws_fetch, started["dream_id"], "dream_ended")  # done when it has read every chunk
    code, dream = await call(jp_fetch, "GET", "dreams", started["dream_id"])
    assert code == 200
    return dream


async def test_memory_and_dream_routes(recorded, jp_fetch, jp_ws_fetch):  # recorded first: the file exists before the server opens it
    dream = await dream_to_the_end(jp_fetch, jp_ws_fetch, {"sessions": recorded, "model": "scripted:dream"})
    assert dream["state"] == "done" and dream["stop_reason"] == "end_turn" and set(dream["read"]) == set(recorded)
    proposed = [m["id"] for m in dream["proposals"]]
    assert len(proposed) >= 4

    code, listed = await call(jp_fetch, "GET", "memories", params={"status": "proposed"})
    assert code == 200 and [m["id"] for m in listed["memories"]] == proposed
    code, dreams = await call(jp_fetch, "GET", "dreams")
    assert [d["id"] for d in dreams["dreams"]] == [dream["session"]["id"]]

    code, m = await call(jp_fetch, "PATCH", "memories", proposed[0], body={"action": "accept", "text": "Print results with two decimals."})
    assert code == 200 and m["status"] == "accepted" and [v["action"] for v in m["history"]] == ["propose", "edit", "accept"]
    assert m["history"][-1]["actor"].startswith("person:")
    code, m = await call(jp_fetch, "PATCH", "memories", proposed[1], body={"action": "reject", "note": "dup"})
    assert code == 200 and m["history"][-1]["actor"].startswith("person:")

    assert (await call(jp_fetch, "PATCH", "memories", proposed[1], body={"action": "reject"}))[0] == 409
    assert (await call(jp_fetch, "PATCH", "memories", "nope", body={"action": "accept"}))[0] == 404
    code, err = await call(jp_fetch, "PATCH", "memories", proposed[2], body={"action": "delete"})
    assert code == 400 and "unknown review action" in err["error"]
    code, one = await call(jp_fetch, "GET", "memories", proposed[0])
    assert code == 200 and one["provenance"] and one["history"]

    # a session created now starts with the accepted memory in its frozen prompt
    code, s = await call(jp_fetch, "POST", "sessions", body={"model": "scripted"})
    code, events = await call(jp_fetch, "GET", "sessions", s["id"], "events")
    first, second = events["events"][:2]
    assert "Print results with two decimals." in first["payload"]["system"]
    assert second["type"] == "memories_injected" and second["payload"]["memories"][0]["id"] == proposed[0]

    # cancelling: a dream that ended stays done; a chat session is not a dream; hostile ids and bodies are refused
    code, c = await call(jp_fetch, "POST", "dreams", dream["session"]["id"], "cancel", body={})
    assert code == 200 and c["cancelled"] is False and c["state"] == "done"
    assert (await call(jp_fetch, "POST", "dreams", s["id"], "cancel", body={}))[0] == 400
    assert (await call(jp_fetch, "POST", "dreams", "nope", "cancel", body={}))[0] == 404
    assert (await call(jp_fetch, "POST", "dreams", dream["session"]["id"], "cancel", body={"x": 1}))[0] == 400
    assert (await call(jp_fetch, "POST", "dreams", "<script>", "cancel", body={}))[0] in (400, 404)
    code, dreams = await call(jp_fetch, "GET", "dreams")
    assert [(d["state"], d["chunks"]) for d in dreams["dreams"]] == [("done", 1)]

    # dreaming again over the same sessions proposes nothing new
    again = await dream_to_the_end(jp_fetch, jp_ws_fetch, {"sessions": recorded, "model": "scripted:dream"})
    assert again["proposals"] == []
    assert (await call(jp_fetch, "POST", "dreams", body={"sessions": "x"}))[0] == 400


async def test_a_turn_cut_off_in_a_dream_that_had_ended_is_finished_at_the_next_wake(recorded, jp_fetch, jp_ws_fetch,
                                                                                      jp_serverapp):
    """A message sent to a dream after it ended is an ordinary turn: cut off by a dead server, the next start
    finishes it (it was left unfinished for good, since dreams are the memory plugin's to resume and the plugin
    resumes only unfinished dreams: found by the fault test)."""
    dream = await dream_to_the_end(jp_fetch, jp_ws_fetch, {"sessions": recorded, "model": "scripted:dream"})
    did = dream["session"]["id"]
    runtime = jp_serverapp.web_app.settings["workbench_runtime"]
    # what a dead server leaves behind: the message committed, its turn never ended
    seq = runtime.log.append(did, "user_message", {"text": "Anything else?"}).seq
    code, s = await call(jp_fetch, "GET", "sessions", did)
    assert code == 200 and s["state"] == "unfinished", s
    assert await runtime.service.wake() == [did]
    await until_event(jp_ws_fetch, did, "turn_ended", after=seq)
    code, s = await call(jp_fetch, "GET", "sessions", did)
    assert s["state"] != "unfinished" and await runtime.service.wake() == []
    code, again = await call(jp_fetch, "GET", "dreams", did)
    assert again["state"] == "done" and [m["id"] for m in again["proposals"]] == [m["id"] for m in dream["proposals"]]


async def test_a_message_to_a_dream_between_two_chunks_is_refused(recorded, jp_fetch, jp_ws_fetch, jp_serverapp, monkeypatch):
    """Between two chunks no turn runs, but the dream's driver goes on: the session is running, and a message
    is a 409 (it was accepted, and the dream's next chunk then failed with TurnBusy: found by the fuzzer)."""
    import asyncio

    from wbmemory import pause_between_chunks

    between, go_on = pause_between_chunks(monkeypatch)
    try:
        code, started = await call(jp_fetch, "POST", "dreams", body={"sessions": recorded, "model": "scripted:dream"})
        assert code == 202
        did = started["dream_id"]
        assert await asyncio.to_thread(between.wait, 120)
        code, s = await call(jp_fetch, "GET", "sessions", did)
        assert s["running"] is True, s
        code, err = await call(jp_fetch, "POST", "sessions", did, "messages", body={"text": "hello?"})
        assert code == 409 and "between its turns" in err["error"], (code, err)
    finally:
        go_on.set()
    await until_event(jp_ws_fetch, did, "dream_ended")
    code, dream = await call(jp_fetch, "GET", "dreams", did)
    assert dream["state"] == "done" and not any(e["type"] == "user_message" and e["payload"]["text"] == "hello?"
                                                for e in (await call(jp_fetch, "GET", "sessions", did, "events"))[1]["events"])
