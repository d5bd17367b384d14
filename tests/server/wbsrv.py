"""Helpers of the server tests: an API client over pytest-jupyter's fetchers, and real server subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tornado.httpclient import HTTPClientError

API = ("workbench", "api")


class WB:
    def __init__(self, fetch: Any, ws_fetch: Any):
        self.fetch, self.ws_fetch = fetch, ws_fetch

    async def call(self, method: str, *path: str, body: Any = None, params: dict | None = None, expect: int | None = None) -> tuple[int, Any]:
        kw: dict[str, Any] = {"method": method, "params": params}
        if method == "POST":
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


async def read_until(ws: Any, stop: Any, deltas: list | None = None) -> list[dict[str, Any]]:
    """Events from a stream until one for which stop(event) is true (deltas go to `deltas`)."""
    events = []
    while True:
        raw = await ws.read_message()
        assert raw is not None, "the stream closed early"
        msg = json.loads(raw)
        if msg["kind"] == "delta":
            if deltas is not None:
                deltas.append(msg)
            continue
        events.append(msg["event"])
        if stop(msg["event"]):
            return events


def turn_ended(e: dict[str, Any]) -> bool:
    return e["type"] == "turn_ended"


# -- a real `jupyter server` subprocess -------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`jupyter server` on 127.0.0.1 with token auth and its own temp dirs and DB."""

    def __init__(self, home: Path, db: Path, env: dict[str, str] | None = None, extra: list[str] | None = None):
        self.home, self.db, self.port = home, db, free_port()
        self.token = "wbtest-" + os.urandom(8).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "HOME": str(home),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "WORKBENCH_DB": str(db),
            "WORKBENCH_HANDS_POOL_SIZE": "0",
            **(env or {}),
        }
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None
        self.children: list[Any] = []  # kernels seen before a kill, stopped at the end
        self.logfile = home / f"server-{self.port}.log"

    def start(self, timeout: float = 60) -> "ServerProcess":
        for d in ("runtime", "data", "config"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        # only the workbench extension: the others (lab, lsp, panel, ...) just slow the start down
        others = {name: False for name in ("jupyterlab", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals", "panel.io.jupyter_server_extension", "notebook")}
        config = {"ServerApp": {"jpserver_extensions": {**others, "workbench": True}}}
        (self.home / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
        cmd = [
            sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
            "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.home}",
            "--ServerApp.allow_root=True", *self.extra,
        ]
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited: {self.log_tail()}")
            try:
                r = httpx.get(f"{self.url}/workbench/api/status", headers=self.headers, timeout=2)
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"jupyter server did not answer in {timeout} s: {self.log_tail()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def log_tail(self, n: int = 4000) -> str:
        return self.logfile.read_text(errors="replace")[-n:] if self.logfile.exists() else ""

    def kill(self) -> None:
        """SIGKILL the server alone: its kernels are left behind, as after a crash."""
        if self.proc and self.proc.poll() is None:
            import psutil

            self.children = psutil.Process(self.proc.pid).children(recursive=True)
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and anything left in its process group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for child in self.children:
            try:
                child.kill()
            except Exception:  # already gone (reaped by the next server, as it should be)
                pass
