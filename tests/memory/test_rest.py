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


async def dream_to_the_end(jp_fetch, jp_ws_fetch, body):
    code, started = await call(jp_fetch, "POST", "dreams", body=body)
    assert code == 202 and started["state"] == "running", started
    ws = await jp_ws_fetch(*API, "sessions", started["dream_id"], "stream", params={"after": "0"})
    try:
        while True:  # the dream is done when it has recorded what it read
            msg = json.loads(await ws.read_message())
            if msg["kind"] == "event" and msg["event"]["type"] == "dream_read":
                break
    finally:
        ws.close()
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
    code, m = await call(jp_fetch, "PATCH", "memories", proposed[1], body={"action": "reject", "actor": "api:ci", "note": "dup"})
    assert code == 200 and m["history"][-1]["actor"] == "api:ci"

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

    # dreaming again over the same sessions proposes nothing new
    again = await dream_to_the_end(jp_fetch, jp_ws_fetch, {"sessions": recorded, "model": "scripted:dream"})
    assert again["proposals"] == []
    assert (await call(jp_fetch, "POST", "dreams", body={"sessions": "x"}))[0] == 400
