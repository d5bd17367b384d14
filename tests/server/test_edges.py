"""The findings of the security review, one by one, against a real in-process server: bad input is a
4xx with a JSON error naming the field, and a refused request writes nothing."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

API = ("workbench", "api")
MiB = 1 << 20


async def raw(jp_fetch, method: str, *path: str, body: bytes | str | None = None, params: dict | list | None = None,
              headers: dict | None = None) -> tuple[int, dict]:
    """Send exactly `body`; the status and the JSON body (the test fails if the body is not JSON)."""
    kw = {"method": method, "params": params, "headers": headers or {}, "allow_nonstandard_methods": True}
    if body is not None or method in ("POST", "PATCH", "PUT"):
        kw["body"] = body if body is not None else b""
    try:
        r = await jp_fetch(*API, *path, **kw)
        code, text = r.code, r.body
    except HTTPClientError as e:
        code, text = e.code, e.response.body if e.response is not None else b""
    try:
        data = json.loads(text)
    except ValueError:
        raise AssertionError(f"{method} {path}: HTTP {code} with a body that is not JSON: {text[:200]!r}") from None
    return code, data


def refused(code: int, data: dict, status: int, words: str) -> None:
    assert code == status, (code, data)
    assert isinstance(data, dict) and isinstance(data.get("error"), str) and "\n" not in data["error"], data
    assert words.lower() in data["error"].lower(), (words, data["error"])


@pytest.fixture
def memory(jp_serverapp):
    """Make proposed memories in the server's own store (its log's DuckDB file)."""
    runtime = jp_serverapp.web_app.settings["workbench_runtime"]

    def make(n: int = 1) -> list[str]:
        store = runtime.host.plugin("memory").store
        return [store.create(title=f"m{i}", text=f"remember {i}", actor="api:test", provenance=[]) for i in range(n)]

    return make


async def snapshot(jp_fetch) -> tuple:
    """What a refused request must not change: sessions, their events, memories and their versions."""
    _, s = await raw(jp_fetch, "GET", "sessions")
    _, q = await raw(jp_fetch, "POST", "query", body=json.dumps(
        {"sql": "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM memory_versions)"}))
    return [x["id"] for x in s["sessions"]], q["rows"]


async def test_hostile_bodies_get_a_400_naming_what_is_wrong_and_write_nothing(jp_fetch, memory):
    code, s = await raw(jp_fetch, "POST", "sessions", body='{"model": "scripted"}')
    assert code == 201
    sid, (mid,) = s["id"], memory(1)
    before = await snapshot(jp_fetch)
    deep = b"[" * 1000 + b"]" * 1000
    cases = [
        # JSON nested 1,000 deep was a RecursionError (500)
        ("POST", ("sessions",), deep, 400, "deeper than 32 levels"),
        ("POST", ("sessions", sid, "messages"), b'{"text": ' + deep + b"}", 400, "deeper than 32 levels"),
        ("PATCH", ("memories", mid), b'{"action": "edit", "tags": ' + deep + b"}", 400, "deeper than 32 levels"),
        # a parameter nested 500 deep took seconds in /query
        ("POST", ("query",), b'{"sql": "SELECT ?", "params": [' + b"[" * 500 + b"]" * 500 + b"]}", 400, "deeper than 32"),
        # lone surrogates in titles, messages, memory fields, dream parameters
        ("POST", ("sessions",), b'{"title": "a\\ud800b"}', 400, "surrogate"),
        ("POST", ("sessions", sid, "messages"), b'{"text": "hi \\udfff"}', 400, "surrogate"),
        ("PATCH", ("memories", mid), b'{"action": "edit", "text": "\\ud800"}', 400, "surrogate"),
        ("PATCH", ("memories", mid), b'{"action": "reject", "note": "\\udbff"}', 400, "surrogate"),
        ("POST", ("dreams",), b'{"model": "scripted:dream", "instructions": "\\ud800"}', 400, "surrogate"),
        # bytes that are not UTF-8, a byte order mark
        ("POST", ("sessions",), b'{"title": "\xff"}', 400, "UTF-8"),
        ("POST", ("sessions",), b"\xef\xbb\xbf{}", 400, "strict JSON"),
        # non-finite numbers, before anything is written
        ("POST", ("sessions",), b'{"config": {"max_tokens": 1e309}}', 400, "infinity"),
        ("POST", ("sessions",), b'{"config": {"hands": {"timeout": NaN}}}', 400, "NaN"),
        ("POST", ("sessions",), b'{"config": {"hands": {"timeout": -Infinity}}}', 400, "not strict JSON"),
        # wrong types, no coercion
        ("POST", ("dreams",), b'{"model": 5}', 400, '"model" must be a string'),
        ("POST", ("sessions",), b'{"config": {"egress": {"allow": [1]}}}', 400, "config.egress.allow[0]"),
        ("POST", ("sessions",), b'{"config": {"egress": {"credentials": [{}]}}}', 400, "config.egress.credentials[0]"),
        ("POST", ("sessions",), b'{"config": {"max_tokens": "100"}}', 400, "config.max_tokens"),
        ("POST", ("sessions",), b'{"config": {"max_tokens": 100.0}}', 400, "config.max_tokens"),
        ("POST", ("sessions",), b'{"config": {"max_tokens": true}}', 400, "config.max_tokens"),
        ("POST", ("sessions",), b'{"config": {"hands": {"timeout": 1e300}}}', 400, "config.hands.timeout"),
        ("POST", ("sessions",), b'{"config": {"hands": {"env": {"A": 1}}}}', 400, "config.hands.env.A"),
        # a relative workdir was under the server's working directory: the fuzzer's "1" put an upload in the repository
        ("POST", ("sessions",), b'{"config": {"hands": {"workdir": "1"}}}', 400, "must be an absolute path"),
        ("POST", ("sessions",), b'{"config": {"hands": {"workdir": ""}}}', 400, "must be an absolute path"),
        ("POST", ("sessions",), b'{"config": {"egress": {"max_requests": 100000000000000000000}}}', 400, "max_requests"),
        ("PATCH", ("memories", mid), b'{"action": "accept", "note": 5}', 400, '"note" must be a string'),
        ("PATCH", ("memories", mid), b'{"action": "edit", "tags": "x"}', 400, '"tags" must be a list'),
        ("PATCH", ("memories", mid), b'{"action": "edit", "tags": [1]}', 400, '"tags[0]"'),
        # a field an action does not take was a TypeError in the store (500)
        ("PATCH", ("memories", mid), b'{"action": "reject", "title": "x"}', 400, 'unknown field "title"'),
        ("PATCH", ("memories", mid), b'{"action": "retire", "with": []}', 400, 'unknown field "with"'),
        ("PATCH", ("memories", mid), b'{"action": "accept", "extra": 1}', 400, 'unknown field "extra"'),
        # who reviews is the authenticated user, never a field (issue 15: any actor was recorded)
        ("PATCH", ("memories", mid), b'{"action": "accept", "actor": "dream:x"}', 400, "recorded as the authenticated user"),
        # routes that take no body take no fields
        ("POST", ("sessions", sid, "interrupt"), b'{"by": "me"}', 400, 'unknown field "by"'),
        ("POST", ("sessions", sid, "hands", "restart"), b"[]", 400, "JSON object"),
        # amplification: 100,000 tool names became a 76 MB event; duplicates; long fields
        ("POST", ("sessions",), json.dumps({"tools": ["python"] * 100_000}), 400, '"tools" has more than 32'),
        ("POST", ("sessions",), json.dumps({"tools": ["python", "python"]}), 400, "twice"),
        ("POST", ("sessions",), json.dumps({"title": "t" * 1001}), 400, '"title" is longer than 1,000'),
        ("POST", ("sessions",), json.dumps({"config": {"egress": {"allow": ["a.b:443"] * 257}}}), 400, "more than 256"),
        ("PATCH", ("memories", mid), json.dumps({"action": "edit", "text": "x" * 10_001}), 400, "longer than 10,000"),
        ("PATCH", ("memories", mid), json.dumps({"action": "edit", "title": "x" * 201}), 400, "longer than 200"),
        ("POST", ("dreams",), json.dumps({"sessions": [sid] * 1001}), 400, "more than 1,000"),
        # bodies over their route's limit: 413, and none of it kept
        ("POST", ("sessions",), json.dumps({"system": "s" * MiB}), 413, "at most 1,048,576"),
        ("PATCH", ("memories", mid), json.dumps({"action": "edit", "text": "x" * (20 * MiB)}), 413, "at most 1,048,576"),
        ("POST", ("sessions", sid, "messages"), json.dumps({"text": "m" * (4 * MiB)}), 413, "at most 4,194,304"),
        ("POST", ("sessions",), b'{"tools": [' + b'"python",' * (2 * MiB) + b'"python"]}', 413, "bytes"),
    ]
    for method, path, body, status, words in cases:
        code, data = await raw(jp_fetch, method, *path, body=body)
        refused(code, data, status, words)
    assert await snapshot(jp_fetch) == before  # nothing written: no session, event, memory version or dream
    # the limits are limits, not rounding: just under them is fine
    code, _ = await raw(jp_fetch, "POST", "sessions", body=json.dumps({"title": "t" * 1000, "tools": ["python"]}))
    assert code == 201
    big = json.dumps({"text": "ok " + "\u00e9" * 999_000}, ensure_ascii=False).encode()  # 2 MB: over 1 MiB, a message's own
    code, _ = await raw(jp_fetch, "POST", "sessions", sid, "messages", body=big)
    assert code == 202 and len(big) > MiB


async def test_after_and_limit_are_plain_ascii_digits_and_query_arguments_are_known(jp_fetch, memory):
    code, s = await raw(jp_fetch, "POST", "sessions", body='{"model": "scripted"}')
    sid = s["id"]
    for bad in ("+1", " 1", "1 ", "1_0", "\u0661", "\uff11", "-1", "1.0", "0x1", "", "9" * 19):
        refused(*await raw(jp_fetch, "GET", "sessions", sid, "events", params={"after": bad}), 400, '"after"')
        refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream", params={"after": bad}), 400, '"after"')
    for bad in ("0", "100001", "+5"):
        refused(*await raw(jp_fetch, "GET", "sessions", sid, "events", params={"limit": bad}), 400, '"limit"')
    code, page = await raw(jp_fetch, "GET", "sessions", sid, "events", params={"after": "0", "limit": "1"})
    assert code == 200 and [e["seq"] for e in page["events"]] == [1]
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "events", params=[("after", "1"), ("after", "2")]), 400, "given 2 times")
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "events", params={"afterr": "1"}), 400, "unknown query argument 'afterr'")
    refused(*await raw(jp_fetch, "GET", "sessions", params={"x": "1"}), 400, "unknown query argument")
    refused(*await raw(jp_fetch, "GET", "memories", params={"status": "nope"}), 400, '"status" must be one of')
    refused(*await raw(jp_fetch, "GET", "memories", params={"search": b"\xed\xa0\x80"}), 400, "not valid UTF-8")
    refused(*await raw(jp_fetch, "GET", "memories", params={"search": "s" * 1001}), 400, "longer than 1,000")
    code, _ = await raw(jp_fetch, "GET", "memories", params={"status": "proposed", "search": "x"})
    assert code == 200
    # Jupyter's own query arguments are always allowed
    code, _ = await raw(jp_fetch, "GET", "sessions", params={"_xsrf": "x"})
    assert code == 200
    # ids no session can have are a 404 without a long echo
    refused(*await raw(jp_fetch, "GET", "sessions", "x" * 5000), 404, "no session 'xxxx")
    refused(*await raw(jp_fetch, "GET", "memories", "a\x01b"), 404, "no memory")


async def test_the_stream_route_and_unknown_paths_answer_json_before_any_upgrade(jp_fetch):
    code, s = await raw(jp_fetch, "POST", "sessions", body='{"model": "scripted"}')
    sid = s["id"]
    ws = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
          "Sec-WebSocket-Version": "13"}
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        refused(*await raw(jp_fetch, method, "sessions", sid, "stream", body=b"{}", headers=dict(ws)), 405, "not allowed")
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream"), 400, "Upgrade: websocket")
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream", headers={"Upgrade": "websocket"}), 400, "Connection: Upgrade")
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream", headers={**ws, "Sec-WebSocket-Version": "8"}), 426, "version 13")
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream", headers={**ws, "Sec-WebSocket-Key": ""}), 400, "Sec-WebSocket-Key")
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream", headers={**ws, "Authorization": ""}), 403, "forbidden")
    refused(*await raw(jp_fetch, "GET", "sessions", "nope", "stream", headers=dict(ws)), 404, "no session 'nope'")
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream", params={"after": "x"}, headers=dict(ws)), 400, '"after"')
    refused(*await raw(jp_fetch, "GET", "sessions", sid, "stream", params={"x": "1"}, headers=dict(ws)), 400, "unknown query argument")
    # any other path under the API is a JSON 404 (and a 403 without auth), whatever the verb
    for method in ("GET", "POST", "PATCH", "DELETE"):
        refused(*await raw(jp_fetch, method, "nosuch", body=b"{}" if method != "GET" else None), 404, "no such route")
        refused(*await raw(jp_fetch, method, "sessions", sid, "x", "y", body=b"{}" if method != "GET" else None), 404, "no such route")
    refused(*await raw(jp_fetch, "GET", "nosuch", headers={"Authorization": ""}), 403, "forbidden")
    # and the verbs a route does not serve
    refused(*await raw(jp_fetch, "PUT", "sessions", sid, body=b"{}"), 405, "not allowed")  # DELETE is a route now
    refused(*await raw(jp_fetch, "PUT", "memories", body=b"{}"), 405, "not allowed")


async def test_a_refused_dream_leaves_no_session_behind(jp_fetch):
    """A dream with a bad parameter was created and then refused, staying `new` forever."""
    before = await snapshot(jp_fetch)
    for body in (b'{"instructions": "\\ud800"}', b'{"model": "no-such-model"}', b'{"model": "scripted:nope"}',
                 b'{"instructions": "   "}', b'{"sessions": "x"}', b'{"sessions": [5]}'):
        code, data = await raw(jp_fetch, "POST", "dreams", body=body)
        assert code == 400 and data["error"], (body, code, data)
    assert await snapshot(jp_fetch) == before
    _, dreams = await raw(jp_fetch, "GET", "dreams")
    assert dreams == {"dreams": []}


@pytest.fixture
def fragile_plugin(monkeypatch):
    """The server loads a plugin whose config check raises TypeError/KeyError on hostile values (wbplugin.py)."""
    monkeypatch.setenv("WORKBENCH_PLUGINS", "wbplugin:FragilePlugin")


async def test_a_plugin_config_check_that_breaks_on_a_hostile_value_still_refuses_it(fragile_plugin, jp_fetch):
    before = await snapshot(jp_fetch)
    for value in ('"x"', "[]", "{}", '{"level": "1"}', "null"):
        code, data = await raw(jp_fetch, "POST", "sessions", body='{"config": {"fragile": %s}}' % value)
        refused(code, data, 400, '"config.fragile" is not valid')
    assert await snapshot(jp_fetch) == before
    code, s = await raw(jp_fetch, "POST", "sessions", body='{"model": "scripted", "config": {"fragile": {"level": 1}}}')
    assert code == 201


async def test_merging_cannot_grow_a_memory_past_the_text_limit(jp_fetch, jp_serverapp):
    """Merges without a text join the texts; merging merges would grow a memory without bound."""
    store = jp_serverapp.web_app.settings["workbench_runtime"].host.plugin("memory").store
    a, b = (store.create(title=f"long {i}", text=str(i) * 6000, actor="api:test", provenance=[]) for i in range(2))
    before = await snapshot(jp_fetch)
    code, data = await raw(jp_fetch, "PATCH", "memories", a, body=json.dumps({"action": "merge", "with": [b]}))
    refused(code, data, 400, "the merged text would be 12,002 characters")
    code, data = await raw(jp_fetch, "PATCH", "memories", a, body=json.dumps({"action": "merge", "with": [b, "nope"]}))
    refused(code, data, 404, "no memory 'nope'")
    assert await snapshot(jp_fetch) == before
    code, merged = await raw(jp_fetch, "PATCH", "memories", a, body=json.dumps({"action": "merge", "with": [b], "text": "both, short"}))
    assert code == 200 and merged["text"] == "both, short" and merged["status"] == "accepted"


async def test_jupyterlabs_cache_buster_is_not_an_unknown_argument(jp_fetch):
    """JupyterLab's ServerConnection adds `?<time in ms>` (no value) to every GET."""
    code, data = await raw(jp_fetch, "GET", "sessions", params=[("1796069398248", "")])
    assert code == 200 and data == {"sessions": [], "next": None}
    code, data = await raw(jp_fetch, "GET", "memories", params=[("status", "proposed"), ("1796069398761", "")])
    assert code == 200
    refused(*await raw(jp_fetch, "GET", "sessions", params=[("1796069398248", "1")]), 400, "unknown query argument")


async def test_sessions_listing_filters_pages_and_refuses_bad_arguments(jp_fetch):
    for i in range(5):
        code, _ = await raw(jp_fetch, "POST", "sessions", body=json.dumps({"id": f"s{i}", "title": f"About {'PRICES' if i % 2 else 'rain'}",
                                                                            "model": "scripted"}))
        assert code == 201
    code, s = await raw(jp_fetch, "POST", "sessions", body=json.dumps({"id": "s0", "model": "scripted"}))
    assert code == 409, s
    code, all_ = await raw(jp_fetch, "GET", "sessions")
    assert code == 200 and all_["next"] is None and [x["id"] for x in all_["sessions"]] == [f"s{i}" for i in range(5)]
    assert all("running" in x and x["state"] == "new" for x in all_["sessions"])
    code, found = await raw(jp_fetch, "GET", "sessions", params={"q": "prices", "order": "-created"})
    assert code == 200 and [x["id"] for x in found["sessions"]] == ["s3", "s1"]
    seen, cursor = [], None
    while True:
        params = {"limit": "2", "order": "-updated", **({"cursor": cursor} if cursor else {})}
        code, page = await raw(jp_fetch, "GET", "sessions", params=params)
        assert code == 200, page
        seen += [x["id"] for x in page["sessions"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(seen) == [f"s{i}" for i in range(5)] and len(seen) == 5
    before = await snapshot(jp_fetch)
    for params, words in [
        ({"state": "running"}, "state"), ({"order": "newest"}, "order"), ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"), ({"limit": "-1"}, "limit"), ({"limit": "1e3"}, "limit"), ({"cursor": "bogus"}, "cursor"),
        ({"updated_after": "yesterday"}, "updated_after"), ({"updated_before": "NaN"}, "updated_before"),
        ({"q": "x" * 5000}, "q"), ({"cursor": "x" * 10000}, "cursor"), ({"bogus": "1"}, "unknown query argument"),
        ({"kind": "\x00"}, ""),
    ]:
        code, data = await raw(jp_fetch, "GET", "sessions", params=params)
        if params.get("kind"):
            assert code == 200 and data["sessions"] == [], data  # a kind no session has: nothing, not an error
            continue
        refused(code, data, 400, words)
    for bad in ["", "a/b", "../x", "x" * 300, "-x", "a b", "é"]:
        code, data = await raw(jp_fetch, "POST", "sessions", body=json.dumps({"id": bad, "model": "scripted"}))
        refused(code, data, 400, "id")
    assert await snapshot(jp_fetch) == before
