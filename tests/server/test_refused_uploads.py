"""A request Jupyter refuses before its body is read (a token in the URL makes it check XSRF: 403) gets its
JSON answer (403 XSRF, 400 a token that is not UTF-8) even when the body is big, and the connection stays usable: the server reads the body and drops
it instead of closing the connection mid-upload (a client still sending got a reset, no answer: the
fuzzer's finding, seed 582699623 request #1133)."""

from __future__ import annotations

import asyncio
import json

from wbfuzz import API, RawClient, Request

from workbench.client import WorkbenchClient

MiB = 1 << 20


def test_a_big_body_refused_before_it_is_read_gets_its_answer_on_a_connection_that_stays(server_process, tmp_path):
    server = server_process(tmp_path / "wb.duckdb", env={"WORKBENCH_FILES_MAX_UPLOAD_MB": "1"})
    client = WorkbenchClient(server.url, server.token)
    sid = client.create_session(model="scripted")["id"]
    before = client.events(sid)
    cases = [
        (f"{API}/sessions/{sid}/messages", json.dumps({"text": "y" * (4 * MiB + 1000)}).encode()),  # over the limit
        (f"{API}/sessions/{sid}/messages", json.dumps({"text": "y" * (3 * MiB)}).encode()),  # under it
        (f"{API}/sessions", json.dumps({"system": "s" * (2 * MiB)}).encode()),
        (f"{API}/sessions/{sid}/files?path=a.txt", b"z" * (3 * MiB)),  # an upload, over its limit
        (f"{API}/sessions/{sid}/files?path=a.txt", b"z" * (MiB // 2)),  # under it
        (f"{API}/query", json.dumps({"sql": "SELECT 1", "params": ["p" * MiB]}).encode()),
    ]
    not_utf8 = [  # an id in the path that is not UTF-8: refused before the body is read (the fuzzer, seed 267685845)
        (f"{API}/sessions/%C3%28/messages", json.dumps({"text": "y" * (12 * MiB)}).encode()),
        (f"{API}/sessions/%FF/files?path=a.txt", b"z" * (3 * MiB)),
    ]

    async def go() -> None:
        raw = RawClient("127.0.0.1", server.port, server.token, timeout=120)
        try:
            for target, body in cases:
                for token in ("x", "%FF"):
                    resp = await raw.send(Request("POST", target + ("&" if "?" in target else "?") + "token=" + token, body))
                    assert resp.status in (400, 403), (target, token, resp.status, resp.body[:200])  # XSRF; bad token
                    error = json.loads(resp.body)["error"]
                    assert isinstance(error, str) and error, resp.body[:200]
                    assert raw.writer is not None, "the server closed the connection"  # kept alive: it read the body
            for target, body in not_utf8:
                sep = "&" if "?" in target else "?"
                resp = await raw.send(Request("POST", f"{target}{sep}token={server.token}", body))
                assert resp.status == 400 and "unicode" in json.loads(resp.body)["error"].lower(), (target, resp.body[:200])
                assert raw.writer is not None, "the server closed the connection"
            ok = await raw.send(Request("GET", f"{API}/status"))  # the same connection still answers
            assert ok.status == 200
        finally:
            await raw.close()

    asyncio.run(go())
    assert client.events(sid) == before  # a refused request wrote nothing
    assert client.files(sid) == []
    assert len(client.sessions()) == 1
