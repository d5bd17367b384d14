"""A real `jupyter server` subprocess on 127.0.0.1 with a token, for the peer and scale benchmarks."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from workbench.testing.jupyter import JupyterProcess, free_port

__all__ = ["JupyterServer", "execute_request", "free_port", "ws_execute"]


class JupyterServer(JupyterProcess):
    """Starts and stops one `jupyter server`; `workbench=False` disables the workbench extension."""

    def __init__(self, home: Path, *, workbench: bool, env: dict[str, str] | None = None, args: list[str] | None = None):
        super().__init__(home, env=env, extensions={"workbench": workbench}, args=args, token_prefix="bench-",
                         probe="/workbench/api/status" if workbench else "/api/status", grace=30.0, poll=0.1)
        self.workbench = workbench

    def start(self, timeout: float = 90.0) -> "JupyterServer":
        super().start(timeout)
        return self

    def tail(self, n: int = 2000) -> str:
        return self.log_tail(n)

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
        super().stop()
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
