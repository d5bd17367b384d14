"""A message POST can be sent again safely: with its idempotency key it is recorded once and answered as the
first was (issue 22: a message was recorded although its POST got no answer, and a client that retries sent it
twice). Against the in-process server, a real server subprocess, a proxy that loses an answer, and a restart."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

from wbsrv import WB

from workbench.client import WorkbenchClient
from workbench.errors import RequestRefused


async def user_messages(wb: WB, sid: str) -> list[dict]:
    _, r = await wb.call("GET", "sessions", sid, "events", expect=200)
    return [e for e in r["events"] if e["type"] == "user_message"]


async def idle(wb: WB, sid: str) -> None:
    while (await wb.call("GET", "sessions", sid, expect=200))[1]["running"]:
        await asyncio.sleep(0.05)


async def test_the_same_message_posted_again_or_concurrently_is_recorded_once(wb):
    sid = await wb.session(model="scripted")
    body = {"text": "hello", "idempotency_key": "5b0c8f1e-7d4a-4c2b-9e3f-1a2b3c4d5e6f"}
    _, first = await wb.call("POST", "sessions", sid, "messages", body=body, expect=202)
    _, again = await wb.call("POST", "sessions", sid, "messages", body=body, expect=202)
    assert again == first
    await idle(wb, sid)
    _, late = await wb.call("POST", "sessions", sid, "messages", body=body, expect=202)  # after its turn ended
    assert late == first
    # concurrently: one is recorded, every POST gets its seq
    twice = {"text": "twice?", "idempotency_key": "k2"}
    answers = await asyncio.gather(*(wb.call("POST", "sessions", sid, "messages", body=twice) for _ in range(6)))
    assert {code for code, _ in answers} == {202} and len({a["seq"] for _, a in answers}) == 1, answers
    await idle(wb, sid)
    messages = await user_messages(wb, sid)
    assert [(m["seq"], m["payload"]) for m in messages] == [(first["seq"], body), (answers[0][1]["seq"], twice)]

    # the same key with another message: 422, one line naming the key; a key of the wrong shape: 400; nothing written
    _, before = await wb.call("GET", "sessions", sid, "events", expect=200)
    code, err = await wb.call("POST", "sessions", sid, "messages", body={"text": "hello again", "idempotency_key": "k2"})
    assert code == 422 and "k2" in err["error"] and "another message" in err["error"] and "\n" not in err["error"], err
    # the same text with other notebook context (docs/api.md, "Notebook context") is another message too
    cells = [{"kind": "cells", "path": "a.ipynb", "cells": [{"index": 0, "cell_type": "code", "source": "1/0"}]}]
    code, err = await wb.call("POST", "sessions", sid, "messages", body={**twice, "attachments": cells})
    assert code == 422 and "another message" in err["error"], err
    for key in ("", "a b", "k" * 129, "é", 7, 1.5, True, ["k"], {"k": 1}):
        code, err = await wb.call("POST", "sessions", sid, "messages", body={"text": "x", "idempotency_key": key})
        assert code == 400 and "idempotency_key" in err["error"], (key, code, err)
    _, after = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert after == before
    # and a message with context sent again with its key is the same message (stored as checked: ANSI taken out)
    colour = {"text": "fix", "idempotency_key": "k3", "attachments": [
        {**cells[0], "cells": [{**cells[0]["cells"][0], "outputs": [{"type": "stream", "text": "\x1b[31mred\x1b[0m"}]}]}]}
    _, sent = await wb.call("POST", "sessions", sid, "messages", body=colour, expect=202)
    _, again = await wb.call("POST", "sessions", sid, "messages", body=colour, expect=202)
    assert again == sent
    await idle(wb, sid)


class LossyProxy:
    """A TCP proxy to a server that loses the answer to the first message POST: the server gets the request and
    answers, and the client's connection is closed before a byte of the answer reaches it."""

    def __init__(self, upstream: int):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lost = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for s in [self.listener, *self.sockets]:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, server]
            lose = threading.Event()
            threading.Thread(target=self._up, args=(client, server, lose), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, lose), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, lose: threading.Event) -> None:
        while data := _recv(client):
            if data.startswith(b"POST ") and b"/messages" in data.split(b"\r\n", 1)[0] and not self.lost:
                self.lost += 1
                lose.set()
            server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, lose: threading.Event) -> None:
        while data := _recv(server):
            if lose.is_set():  # the answer to the message: dropped, and the client's connection with it
                client.shutdown(socket.SHUT_RDWR)
                return
            client.sendall(data)


def _recv(s: socket.socket) -> bytes:
    try:
        return s.recv(1 << 16)
    except OSError:
        return b""


def test_the_client_sends_a_message_again_when_its_answer_is_lost_and_the_key_outlives_a_restart(server_process, tmp_path):
    db = tmp_path / "wb.duckdb"
    server = server_process(db)
    sid = WorkbenchClient(server.url, server.token).create_session(model="scripted")["id"]
    proxy = LossyProxy(server.port)
    client = WorkbenchClient(f"http://127.0.0.1:{proxy.port}", server.token)
    try:
        seq = client.send(sid, "are you there?")  # its first answer is lost: sent again, with its key
    finally:
        client.close()
        proxy.close()
    assert proxy.lost == 1
    direct = WorkbenchClient(server.url, server.token)
    events = direct.events(sid)
    messages = [e for e in events if e["type"] == "user_message"]
    assert [m["seq"] for m in messages] == [seq] and messages[0]["payload"]["text"] == "are you there?"
    key = messages[0]["payload"]["idempotency_key"]
    direct.close()

    server.stop()
    server = server_process(db)  # a new process, the same log
    client = WorkbenchClient(server.url, server.token)
    try:
        assert client.send(sid, "are you there?", key=key) == seq
        try:
            client.send(sid, "something else", key=key)
            raise AssertionError("the same key with another message was accepted")
        except RequestRefused as e:
            assert e.status == 422, e
        assert [e for e in client.events(sid) if e["type"] == "user_message"] == messages
        assert json.dumps(messages[0]["payload"]).count(key) == 1
    finally:
        client.close()
