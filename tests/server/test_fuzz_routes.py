"""The fuzzer reaches every route the server serves (fast: no server, only the route table and the generators).

Each served path (workbench.server.app.all_handlers with the built-in plugins, as the server loads them) must
be where tornado would send some request target the fuzzer makes; a route added later without a generator
of its own is the generic generator's, because its table is built from the same live route table.
"""

from __future__ import annotations

import re

import wbfuzz
from wbfuzz import API, Fuzzer, Pool, Route, generic_table, served_routes

from workbench.server.routes import pattern

N = 2000  # requests per seed: each route gets about 1/30 of them (the runs are seeded: the same every time)


def routed(target: str, routes: list[tuple[str, type]]) -> str | None:
    """The documented path tornado sends a request target to: the first route whose pattern matches its path."""
    path = target.split("?")[0]
    return next((p for p, _ in routes if re.match(pattern(p), path)), None)


def unreached(routes: list[tuple[str, type]], fuzzer: Fuzzer, seeds: int = 1) -> set[str]:
    pool = Pool(sessions=["5e55i0n0", "5e55i0n1"], dreams=["d7eam0"], memories=["m3m0ry0"], others=["0ther0"])
    hit = {routed(fuzzer_seeded.request(i, pool).target, routes)
           for fuzzer_seeded in (Fuzzer(s, big=False, upload_mb=fuzzer.upload_mb) for s in range(seeds)) for i in range(N)}
    return {p for p, _ in routes} - hit


def test_every_served_route_is_reached_by_some_request():
    routes = served_routes()
    assert len(routes) >= 20  # the core's, the memory plugin's and the evals plugin's
    assert not unreached(routes, Fuzzer(0, big=False)), "routes the fuzzer never sends a request to"


def test_the_generic_table_is_every_served_route_without_a_generator():
    routes = served_routes()
    served = {p.removeprefix(API) for p, _ in routes}
    table = {r.path.removeprefix(API) for r in generic_table()}
    assert table | wbfuzz.SPECIFIC == served
    assert not table & wbfuzz.SPECIFIC
    assert wbfuzz.SPECIFIC <= served, f"generators of routes no longer served: {wbfuzz.SPECIFIC - served}"
    for r in generic_table():  # what the generic generator needs of a handler, found from it
        assert r.verbs, r
    by_path = {r.path.removeprefix(API): r for r in generic_table()}
    assert by_path["/sessions/{id}/fork"].body is not None and "seq" in by_path["/sessions/{id}/fork"].body.model_fields
    assert by_path["/sessions/{id}/files"].raw_body and "path" in by_path["/sessions/{id}/files"].args
    assert "path" in by_path["/sessions/{id}/files/content"].args


class FakeHandler:
    """A handler class as a plugin might add one: a verb, a body model named in its source."""

    async def post(self, id: str) -> None:
        from workbench.server import bodies

        bodies.parse(bodies.MessageBody, {})


def test_a_route_added_later_is_reached_without_touching_the_fuzzer(monkeypatch):
    extra = (f"{API}/sessions/{{id}}/frobnicate/{{thing}}", FakeHandler)
    routes = [*served_routes(), extra]
    table = generic_table(routes)
    assert Route(extra[0], ("POST",), wbfuzz.body_model(FakeHandler), {}) in table
    monkeypatch.setattr(wbfuzz, "_TABLE", table)  # as if the server served it
    assert not unreached(routes, Fuzzer(0, big=False))
    # and the check fails when the fuzzer cannot make a request there: without the generic generator's table
    monkeypatch.setattr(wbfuzz, "_TABLE", generic_table(served_routes()))
    assert unreached(routes, Fuzzer(0, big=False)) == {extra[0]}


def test_generic_requests_are_bounded_and_name_their_route():
    pool = Pool(sessions=["5e55i0n0"], memories=["m3m0ry0"])
    fuzzer = Fuzzer(1, big=True, upload_mb=1)
    uploads = [r for r in (fuzzer.request(i, pool) for i in range(N)) if r.route == "/sessions/{id}/files (generic)"]
    assert uploads and max(len(r.body) for r in uploads if r.method in ("POST", "PUT")) <= (1 << 20) + 1
    # a limit too big to send now and then: only small uploads
    fuzzer = Fuzzer(1, big=True, upload_mb=256)
    assert all(len(r.body) <= 100_000 for r in (fuzzer.request(i, pool) for i in range(N))
               if r.route == "/sessions/{id}/files (generic)" and r.method in ("POST", "PUT"))


# -- the bookkeeping of writes, and the log's checks, when a route removes or makes sessions ----------------


def _generic(method: str, path: str, status: int, body: bytes, pool: Pool, tally: wbfuzz.Tally) -> None:
    documented = re.sub(r"/(5e55\w+|d7eam\w+)(?=/|$)", "/{id}", path)
    req = wbfuzz.Request(method, API + path, route=f"{documented} (generic)")
    wbfuzz.note_success(req, wbfuzz.Response(status, {}, body), pool, tally)


def test_a_generic_write_the_fuzzer_does_not_understand_is_listed_not_counted():
    pool, tally = Pool(sessions=["5e55i0n0", "5e55i0n1"], dreams=["d7eam0"]), wbfuzz.Tally()
    _generic("POST", "/sessions/5e55i0n0/hands/close", 200, b'{"closed": false}', pool, tally)  # understood
    _generic("POST", "/sessions/5e55i0n0/files", 201, b'{"path": "a.txt", "seq": 4}', pool, tally)
    _generic("GET", "/evals/0ther", 200, b'{"run": "r1"}', pool, tally)  # a read: nothing to note
    _generic("POST", "/evals", 400, b'{"error": "no"}', pool, tally)  # refused: nothing either
    assert not tally.opaque and not tally.touched and not tally.announced and not pool.others
    _generic("DELETE", "/sessions/5e55i0n1", 204, b"", pool, tally)  # a route added later
    _generic("POST", "/sessions/d7eam0/fork", 201, b'{"id": "f0rk", "from": {"session_id": "d7eam0"}}', pool, tally)
    _generic("POST", "/evals", 202, b'{"run": "r2", "state": "running"}', pool, tally)
    assert len(tally.opaque) == 3
    assert tally.touched == {"5e55i0n1", "d7eam0"}
    assert tally.announced == {"f0rk", "d7eam0", "r2"} and {"f0rk", "r2"} <= set(pool.others)
    assert tally.sessions_created == tally.messages_accepted == 0  # only what the specific generators understand


def _log(path, sessions: int) -> list[str]:
    from workbench.log import DuckDBLog

    log = DuckDBLog(path)
    try:
        ids = [f"s{i}" for i in range(sessions)]
        for sid in ids:
            log.create_session(sid, title=None, model="scripted", payload={"system": "x"},
                               then=[("user_message", {"text": "hi"}), ("turn_ended", {})])
        return ids
    finally:
        log.close()


def _sql(path, sql: str) -> None:
    import duckdb

    con = duckdb.connect(str(path))
    try:
        con.execute(sql)
    finally:
        con.close()


def test_check_db_takes_a_session_gone_entirely_and_finds_one_half_gone(tmp_path):
    db = tmp_path / "wb.duckdb"
    _log(db, 3)
    assert wbfuzz.check_db(db)[0] == []
    # removed entirely (its events, its summary, its row): what a delete may do
    _sql(db, "DELETE FROM events WHERE session_id = 's0'; DELETE FROM session_summary WHERE session_id = 's0'; "
             "DELETE FROM sessions WHERE id = 's0'")
    problems, counts = wbfuzz.check_db(db, gone={"s0"})
    assert problems == [] and counts["sessions"] == 2
    # a session said to be gone that is still there
    assert any("still has it" in p for p in wbfuzz.check_db(db, gone={"s1"})[0])
    # half removed: its row gone, its events and summary left behind
    _sql(db, "DELETE FROM sessions WHERE id = 's1'")
    problems, _ = wbfuzz.check_db(db, gone={"s1"})
    assert any(p.startswith("events has rows") and "s1" in p for p in problems)
    assert any(p.startswith("session_summary has rows") for p in problems)
