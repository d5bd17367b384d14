"""A real `jupyter server` subprocess on 127.0.0.1 with a token, for the peer and scale benchmarks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """Starts and stops one `jupyter server`; `workbench=False` disables the workbench extension."""

    def __init__(self, home: Path, *, workbench: bool, env: dict[str, str] | None = None, args: list[str] | None = None):
        self.home, self.port = home, free_port()
        self.token = "bench-" + os.urandom(8).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workbench = workbench
        self.env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
                    "JUPYTER_DATA_DIR": str(home / "data"), **(env or {})}
        self.args = args or []
        self.proc: subprocess.Popen | None = None
        self.logfile = home / "server.log"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def start(self, timeout: float = 90.0) -> "JupyterServer":
        for d in ("config", "runtime", "data"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        # the user-level config wins over the environment's, so this turns the extension on or off
        (self.home / "config" / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"workbench": self.workbench}}}))
        cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.home}",
               "--ServerApp.allow_root=True", *self.args]
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        probe = "/workbench/api/status" if self.workbench else "/api/status"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.url + probe, headers=self.headers, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"jupyter server did not answer in {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 2000) -> str:
        return self.logfile.read_text(errors="replace")[-n:] if self.logfile.exists() else ""

    def kernel_pid(self, kernel_id: str) -> int:
        """The pid of a kernel the server started (found by its connection file's name)."""
        import psutil

        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if any(kernel_id in a for a in p.cmdline()):
                    return p.pid
            except psutil.Error:
                continue
        raise RuntimeError(f"no process found for kernel {kernel_id}")

    def rss_mib(self) -> tuple[float, int]:
        """Resident memory of the server and every process under it (its kernels), MiB; and that process count."""
        import psutil

        root = psutil.Process(self.proc.pid)
        total, procs = 0, [root, *root.children(recursive=True)]
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total / 2**20, len(procs)

    def stop(self) -> None:
        """SIGINT (jupyter's clean shutdown, which stops its kernels), then SIGKILL the process group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc = None


def execute_request(code: str, session: str) -> dict[str, Any]:
    """An execute_request in the Jupyter message format, for a kernel websocket."""
    return {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "bench", "session": session,
                   "date": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }


async def ws_execute(server: JupyterServer, kernel_id: str, code: str, timeout: float = 60.0) -> dict[str, Any]:
    """Open the kernel's websocket, run code, return the execute_reply content (then close)."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    ws_url = server.url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
    conn = await websocket_connect(HTTPRequest(ws_url, headers=server.headers))
    try:
        msg = execute_request(code, uuid.uuid4().hex)
        await conn.write_message(json.dumps(msg))
        while True:
            raw = await asyncio.wait_for(conn.read_message(), timeout)
            if raw is None:
                raise RuntimeError("the kernel websocket closed before the reply")
            if isinstance(raw, bytes):
                continue
            reply = json.loads(raw)
            if reply.get("msg_type") == "execute_reply" and reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]
    finally:
        conn.close()
