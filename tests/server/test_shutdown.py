"""Requests during and after the server's shutdown get a JSON 503 (or their connection is refused),
never a 500: a finding of the review was an uncaught "Connection already closed" while the log closed
under requests in flight."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time

from wbfuzz import Pool, RawClient, Request, check_db, first_traceback

API = "/workbench/api"


def judge_stopping(req: Request, resp, error: str) -> str | None:
    """During a shutdown: any 4xx/2xx as usual, a 503 with a JSON error, or no answer at all; never another 5xx."""
    if resp is None:
        if error.startswith("WebSocketClosed") and "with code 1001:" not in error:
            return f"a stream closed otherwise than as going away (1001): {error}"
        return None  # the connection was refused or closed (a stream: as going away): the server is gone
    if resp.status >= 500 and resp.status != 503:
        return f"HTTP {resp.status}: {resp.body[:300]!r}"
    if resp.status == 101 or req.method == "HEAD" or (resp.status == 204):
        return None
    try:
        data = json.loads(resp.body)
    except ValueError:
        return f"HTTP {resp.status} with a body that is not JSON: {resp.body[:200]!r}"
    if resp.status >= 400 and not (isinstance(data, dict) and isinstance(data.get("error"), str)):
        return f"HTTP {resp.status} without an error string: {resp.body[:200]!r}"
    return None


def mixed_request(rng: random.Random, pool: Pool) -> Request:
    """Ordinary traffic, all of it valid: reads, writes, turns, interrupts, queries, streams."""
    sid = rng.choice(pool.sessions)
    return rng.choice((
        lambda: Request("GET", f"{API}/sessions"),
        lambda: Request("GET", f"{API}/sessions/{sid}"),
        lambda: Request("GET", f"{API}/sessions/{sid}/events?after=0"),
        lambda: Request("POST", f"{API}/sessions", b'{"model": "scripted", "title": "during shutdown"}', route="create session"),
        lambda: Request("POST", f"{API}/sessions/{sid}/messages", b'{"text": "hello while stopping"}'),
        lambda: Request("POST", f"{API}/sessions/{sid}/interrupt", b"{}"),
        lambda: Request("POST", f"{API}/sessions/{sid}/resume", b""),
        lambda: Request("POST", f"{API}/query", b'{"sql": "SELECT count(*) FROM events WHERE session_id = ?", "params": ["%s"]}' % sid.encode()),
        lambda: Request("GET", f"{API}/memories?status=proposed"),
        lambda: Request("GET", f"{API}/dreams"),
        lambda: Request("GET", f"{API}/status"),
        lambda: Request("GET", f"{API}/search?q=turn"),
        lambda: Request("PATCH", f"{API}/sessions/{sid}", b'{"title": "renamed while stopping"}'),
        lambda: Request("POST", f"{API}/sessions/{sid}/fork", b"{}"),
        lambda: Request("GET", f"{API}/sessions/{sid}/usage"),
        lambda: Request("GET", f"{API}/sessions/{sid}/hands"),
        lambda: Request("GET", f"{API}/sessions/{sid}/stream?after=0", headers=(
            ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"))),
    ))()


async def hammer(port: int, token: str, pool: Pool, seed: int, until: float, workers: int = 8) -> tuple[list[str], dict]:
    """Send mixed requests on kept-alive connections until `until` (monotonic) or until the server is gone."""
    failures, statuses = [], {}

    async def worker(w: int) -> None:
        rng, client = random.Random(f"{seed}:{w}"), RawClient("127.0.0.1", port, token, timeout=30)
        try:
            while time.monotonic() < until:
                req = mixed_request(rng, pool)
                resp, error = None, ""
                try:
                    resp = await client.send(req)
                except ConnectionRefusedError:
                    return  # no server listening: the shutdown is complete
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
                    error = f"{type(e).__name__}: {e}"
                key = resp.status if resp is not None else "none"
                statuses[key] = statuses.get(key, 0) + 1
                problem = judge_stopping(req, resp, error)
                if problem:
                    failures.append(f"seed {seed} worker {w}: {problem}\n    {req.show()}")
        finally:
            await client.close()

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return failures, statuses


def test_requests_during_and_after_sigterm_get_a_json_503_or_no_connection(server_process, tmp_path):
    import httpx

    seed = random.SystemRandom().randrange(10**9)
    db = tmp_path / "wb.duckdb"
    all_statuses: dict = {}
    for round_ in range(3):
        server = server_process(db)
        client = httpx.Client(base_url=server.url + API, headers=server.headers, timeout=30)
        sids = [client.post("/sessions", json={"model": "scripted"}).json()["id"] for _ in range(4)]
        for sid in sids:
            client.post(f"/sessions/{sid}/messages", json={"text": "a turn that may be running at shutdown"})
        client.close()
        rng = random.Random(f"{seed}:{round_}")

        async def go() -> tuple[list[str], dict]:
            traffic = asyncio.ensure_future(hammer(server.port, server.token, Pool(sessions=sids), seed + round_,
                                                   until=time.monotonic() + 60))
            await asyncio.sleep(rng.uniform(0.3, 1.5))  # the server is busy with everything above
            server.proc.send_signal(signal.SIGTERM)
            return await traffic

        failures, statuses = asyncio.run(go())
        assert server.proc.wait(60) == 0, server.log_tail()
        assert not failures, f"{len(failures)} bad answers during shutdown:\n" + "\n".join(failures[:10])
        assert not first_traceback(server.log_tail(50_000_000)), first_traceback(server.log_tail(50_000_000))
        for k, v in statuses.items():
            all_statuses[k] = all_statuses.get(k, 0) + v
    print(f"statuses over three shutdowns: {all_statuses}")
    assert all_statuses.get(200, 0) > 10  # the traffic was real before each shutdown
    problems, counts = check_db(db)  # every turn the shutdowns cut was closed, nothing is half-written
    assert not problems, "\n".join(problems[:20])
    assert counts.get("state unfinished", 0) == 0


async def test_requests_in_flight_while_the_extension_stops_get_503(jp_serverapp, wb):
    app = next(iter(jp_serverapp.extension_manager.extension_apps["workbench"]))
    sids = [await wb.session(model="scripted") for _ in range(3)]
    for sid in sids:
        await wb.send(sid, "a turn")

    async def one(i: int) -> tuple[int, object]:
        sid = sids[i % 3]
        return await [
            lambda: wb.call("GET", "sessions"),
            lambda: wb.call("GET", "sessions", sid, "events", params={"after": "0"}),
            lambda: wb.call("POST", "sessions", body={"model": "scripted"}),
            lambda: wb.call("POST", "sessions", sid, "messages", body={"text": "more"}),
            lambda: wb.call("POST", "sessions", sid, "interrupt", body={}),
            lambda: wb.call("POST", "query", body={"sql": "SELECT count(*) FROM events"}),
            lambda: wb.call("GET", "memories"),
            lambda: wb.call("GET", "status"),
            lambda: wb.call("GET", "search", params={"q": "turn"}),
            lambda: wb.call("PATCH", "sessions", sid, body={"title": f"renamed {i}"}),
            lambda: wb.call("POST", "sessions", sid, "fork", body={}),
            lambda: wb.call("GET", "sessions", sid, "usage"),
            lambda: wb.call("GET", "models"),
        ][i % 13]()

    ws = await wb.stream(sids[0])
    in_flight = [asyncio.ensure_future(one(i)) for i in range(64)]
    await asyncio.sleep(0)
    await app.stop_extension()  # what the server does at shutdown, with requests still being answered
    while await ws.read_message() is not None:  # the stream's backlog, then its end
        pass
    assert ws.close_code == 1001, ws.close_code  # going away
    after = [await one(i) for i in range(26)]
    for code, data in [*(await asyncio.gather(*in_flight)), *after]:
        assert code < 500 or code == 503, (code, data)
        if code >= 400:
            assert isinstance(data, dict) and isinstance(data.get("error"), str), (code, data)
    for code, data in after:
        assert code == 503 and "shutting down" in data["error"], (code, data)
