"""Helpers of the server tests: an API client over pytest-jupyter's fetchers, and real server subprocesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tornado.httpclient import HTTPClientError

from workbench.testing.jupyter import JupyterProcess, free_port

__all__ = ["WB", "ServerProcess", "free_port", "read_until", "turn_ended"]

API = ("workbench", "api")


class WB:
    def __init__(self, fetch: Any, ws_fetch: Any):
        self.fetch, self.ws_fetch = fetch, ws_fetch

    async def call(self, method: str, *path: str, body: Any = None, params: dict | None = None, expect: int | None = None) -> tuple[int, Any]:
        kw: dict[str, Any] = {"method": method, "params": params}
        if method in ("POST", "PATCH", "PUT"):
            kw["body"] = body if isinstance(body, (str, bytes)) else json.dumps(body if body is not None else {})
        try:
            r = await self.fetch(*API, *path, **kw)
            code, data = r.code, json.loads(r.body or b"null")
        except HTTPClientError as e:
            code = e.code
            data = json.loads(e.response.body) if e.response is not None and e.response.body else None
        if expect is not None:
            assert code == expect, (code, data)
        return code, data

    async def session(self, **body: Any) -> str:
        _, s = await self.call("POST", "sessions", body=body, expect=201)
        return s["id"]

    async def send(self, sid: str, text: str) -> int:
        _, r = await self.call("POST", "sessions", sid, "messages", body={"text": text}, expect=202)
        return r["seq"]

    async def stream(self, sid: str, after: int = 0):
        return await self.ws_fetch(*API, "sessions", sid, "stream", params={"after": str(after)})


async def read_until(ws: Any, stop: Any, deltas: list | None = None, output: list | None = None) -> list[dict[str, Any]]:
    """Events from a stream until one for which stop(event) is true (deltas go to `deltas`, live output to `output`)."""
    events = []
    while True:
        raw = await ws.read_message()
        assert raw is not None, "the stream closed early"
        msg = json.loads(raw)
        if msg["kind"] in ("delta", "output"):
            if msg["kind"] == "delta" and deltas is not None:
                deltas.append(msg)
            if msg["kind"] == "output" and output is not None:
                output.append(msg)
            continue
        events.append(msg["event"])
        if stop(msg["event"]):
            return events


def turn_ended(e: dict[str, Any]) -> bool:
    return e["type"] == "turn_ended"


# -- a real `jupyter server` subprocess -------------------------------------------

# only the workbench extension: the others (lab, lsp, panel, ...) just slow the start down
OTHERS = ("jupyterlab", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals", "panel.io.jupyter_server_extension", "notebook")


class ServerProcess(JupyterProcess):
    """`jupyter server` on 127.0.0.1 with token auth and its own temp dirs and DB."""

    def __init__(self, home: Path, db: Path, env: dict[str, str] | None = None, extra: list[str] | None = None):
        super().__init__(home, env={"HOME": str(home), "WORKBENCH_DB": str(db), "WORKBENCH_HANDS_POOL_SIZE": "0", **(env or {})},
                         extensions={**{name: False for name in OTHERS}, "workbench": True}, args=extra,
                         token_prefix="wbtest-")
        self.db = db
        self.logfile = home / f"server-{self.port}.log"
