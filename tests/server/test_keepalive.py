"""A request the server refuses early does not cost a keep-alive client its next request.

Tornado closes a connection whose request body it has not read when the response is finished, without
saying so if the response's headers went out first: a handler that refuses a request in `prepare` (a path
id that is not UTF-8, a token it cannot read, no auth, XSRF) or a verb tornado does not know (405, before
`prepare`) answered on a connection that the client then reused, and the client's next request met a
closed socket (issue 22: 33 of 6,000 fuzz requests, then 68 of 10,000, got no answer; one message was
recorded although its POST got none). Each kind of early refusal is sent on a kept-alive connection,
then a good POST on the same one: both get their answer, either because the server read (and dropped) the
refused request's body and kept the connection, or because its answer said `Connection: close`.
"""

from __future__ import annotations

import asyncio
import json

from wbfuzz import API, RawClient, Request

from workbench.client import WorkbenchClient

MiB = 1 << 20
UPGRADE = (("Upgrade", "websocket"), ("Connection", "Upgrade"))


def cases(sid: str) -> list[tuple[str, Request]]:
    """(what, request) for every kind of refusal the server makes before or after reading a body."""
    message = json.dumps({"text": "hi"}).encode()
    return [
        ("a path id that is not UTF-8, with a body", Request("POST", f"{API}/sessions/%C3%28/messages", message)),
        ("a path id that is not UTF-8, no body", Request("GET", f"{API}/sessions/%FF/events")),
        ("a path id too long", Request("GET", f"{API}/sessions/{'x' * 1500}/events")),
        ("an unknown session", Request("POST", f"{API}/sessions/nope/messages", message)),
        ("a body over the route's limit", Request("POST", f"{API}/sessions/{sid}/messages", b'{"text": "' + b"y" * (4 * MiB) + b'"}')),
        ("a form body, not JSON", Request("POST", f"{API}/sessions", b"model=scripted",
                                          headers=(("Content-Type", "application/x-www-form-urlencoded"),))),
        ("a multipart body", Request("POST", f"{API}/sessions", b"--b\r\n\r\nx\r\n--b--\r\n",
                                     headers=(("Content-Type", "multipart/form-data; boundary=b"),))),
        ("no auth, a GET", Request("GET", f"{API}/sessions", auth="none")),
        ("no auth, a POST with a body", Request("POST", f"{API}/sessions/{sid}/messages", message, auth="none")),
        ("no auth, a DELETE without a body (XSRF)", Request("DELETE", f"{API}/sessions/{sid}", auth="none")),
        ("a wrong token", Request("POST", f"{API}/sessions", b"{}", auth="bad")),
        ("a token in the URL that is not UTF-8", Request("GET", f"{API}/status?token=%FF")),
        ("XSRF: a token in the URL of a POST", Request("POST", f"{API}/sessions?token=x", b"{}", auth="none")),
        ("an unknown route, a GET", Request("GET", f"{API}/nosuch")),
        ("an unknown route, a POST with a body", Request("POST", f"{API}/nosuch/x", message)),
        ("a verb the route does not answer (405)", Request("PUT", f"{API}/sessions/{sid}/messages", message)),
        ("a verb tornado does not know (405), with a body", Request("TRACE", f"{API}/status", message)),
        ("a verb tornado does not know (405), no body", Request("PROPFIND", f"{API}/sessions/{sid}")),
        ("an upload over the limit (413)", Request("POST", f"{API}/sessions/{sid}/files?path=a.txt", b"z" * (MiB + 1))),
        ("an upload without auth", Request("POST", f"{API}/sessions/{sid}/files?path=b.txt", b"z" * 1000, auth="none")),
        ("an upload with a bad path", Request("POST", f"{API}/sessions/{sid}/files?path=..%2Fx", b"z" * 1000)),
        ("a websocket upgrade without its key", Request("GET", f"{API}/sessions/{sid}/stream", headers=UPGRADE)),
        ("a websocket upgrade of another version", Request("GET", f"{API}/sessions/{sid}/stream",
                                                            headers=(*UPGRADE, ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                                                                     ("Sec-WebSocket-Version", "8")))),
        ("a websocket route without an upgrade", Request("GET", f"{API}/sessions/{sid}/stream")),
        ("a websocket route with a path id that is not UTF-8", Request("GET", f"{API}/sessions/%FF/stream", headers=UPGRADE)),
    ]


def test_every_early_refusal_leaves_a_keep_alive_client_its_next_request(server_process, tmp_path):
    server = server_process(tmp_path / "wb.duckdb", env={"WORKBENCH_FILES_MAX_UPLOAD_MB": "1"})
    client = WorkbenchClient(server.url, server.token)
    sid = client.create_session(model="scripted")["id"]
    lost: list[str] = []

    async def go() -> None:
        for what, req in cases(sid):
            raw = RawClient("127.0.0.1", server.port, server.token, timeout=120)
            try:
                refused = await raw.send(req)
                assert 400 <= refused.status < 500, (what, refused.status, refused.body[:200])
                said_close = refused.headers.get("connection", "").lower() == "close"
                good = Request("POST", f"{API}/sessions", json.dumps({"model": "scripted", "title": what}).encode())
                try:
                    answer = await raw.send(good)  # on the same connection, unless the server said it closes it
                except (OSError, asyncio.IncompleteReadError) as e:
                    lost.append(f"{what}: {refused.status}{' (Connection: close)' if said_close else ''}, then the next "
                                f"request on the connection got no answer ({type(e).__name__})")
                    continue
                assert answer.status == 201, (what, answer.status, answer.body[:200])
            finally:
                await raw.close()

    asyncio.run(go())
    assert not lost, "\n".join(lost)
    titles = [s["title"] for s in client.sessions()]
    assert sorted(t for t in titles if t) == sorted(what for what, _ in cases(sid))  # each good POST recorded once
    assert client.files(sid) == []  # no refused upload wrote anything
