"""A client of the workbench server's REST and websocket API (docs/api.md).

It runs anywhere (a notebook kernel, a script) and never opens the DuckDB
file: the server owns it. `connect()` finds the Jupyter server this kernel
belongs to and its token, or takes them explicitly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from ..errors import RequestRefused, ServerUnavailable

HOW_TO_FIX = (
    "start JupyterLab with the workbench extension enabled (`jupyter server extension enable workbench`), "
    "or pass workbench.connect(url=..., token=...)"
)


@dataclass
class Answer:
    """The end of one turn: the agent's final text, the stop reason and the turn's events."""

    session_id: str
    text: str
    stop_reason: str | None
    events: list[dict[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text


def answer_text(events: list[dict[str, Any]]) -> str:
    """The text of the last assistant turn among `events` (the agent's final words)."""
    for e in reversed(events):
        if e["type"] == "assistant_turn":
            return "\n\n".join(b["text"] for b in e["payload"]["message"]["content"] if b.get("type") == "text")
    return ""


class WorkbenchClient:
    """The workbench API of one Jupyter server, over HTTP and a websocket."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0):
        import httpx

        self.url = url.rstrip("/")
        self.api = self.url + "/workbench/api"
        self.token = token or ""
        self.timeout = timeout
        self.headers = {"Authorization": f"token {self.token}"} if self.token else {}
        self.http = httpx.Client(headers=self.headers, timeout=timeout)
        self.session_id: str | None = None  # the default session of ask()

    def __repr__(self) -> str:
        return f"<WorkbenchClient {self.url}>"

    def close(self) -> None:
        self.http.close()

    # -- REST ----------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        import httpx

        try:
            r = self.http.request(method, self.api + path, json=body, params=params)
        except httpx.HTTPError as e:
            raise ServerUnavailable(f"no workbench server answers at {self.url} ({type(e).__name__}): {HOW_TO_FIX}") from None
        if r.status_code == 404 and path == "/status":
            raise ServerUnavailable(
                f"the Jupyter server at {self.url} does not have the workbench extension enabled: "
                "run `jupyter server extension enable workbench` and restart it"
            )
        if r.status_code == 403:
            raise RequestRefused(403, f"the server at {self.url} refused the token; pass workbench.connect(url=..., token=...)")
        if r.status_code >= 400:
            try:
                message = r.json().get("error") or r.text
            except ValueError:
                message = r.text[:200] or r.reason_phrase
            raise RequestRefused(r.status_code, message)
        return r.json()

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/status")

    def sessions(self) -> list[dict[str, Any]]:
        return self._call("GET", "/sessions")["sessions"]

    def session(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/sessions/{session_id}")

    def create_session(
        self,
        title: str | None = None,
        model: str | None = None,
        system: str | None = None,
        config: dict[str, Any] | None = None,
        tools: list[str] | None = None,
    ) -> dict[str, Any]:
        """Create a session; returns it (with its `id`)."""
        body = {k: v for k, v in dict(title=title, model=model, system=system, config=config, tools=tools).items() if v is not None}
        return self._call("POST", "/sessions", body)

    def send(self, session_id: str, text: str) -> int:
        """Start a turn; returns the seq of its user_message (the turn runs in the server)."""
        return self._call("POST", f"/sessions/{session_id}/messages", {"text": text})["seq"]

    def events(self, session_id: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        params = {"after": after, **({"limit": limit} if limit else {})}
        return self._call("GET", f"/sessions/{session_id}/events", params=params)["events"]

    def interrupt(self, session_id: str | None = None) -> bool:
        return self._call("POST", f"/sessions/{self._sid(session_id)}/interrupt", {})["interrupted"]

    def resume(self, session_id: str | None = None) -> bool:
        return self._call("POST", f"/sessions/{self._sid(session_id)}/resume", {})["resumed"]

    def hands(self, session_id: str | None = None) -> dict[str, Any]:
        return self._call("GET", f"/sessions/{self._sid(session_id)}/hands")

    def restart_hands(self, session_id: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/sessions/{self._sid(session_id)}/hands/restart", {})

    def query(self, sql: str, params: list[Any] | None = None) -> dict[str, Any]:
        """One read-only SQL statement against the session log: {"columns", "rows", "truncated"}."""
        return self._call("POST", "/query", {"sql": sql, "params": params or []})

    # -- memory (the memory plugin's routes) -------------------------------------------

    def memories(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None,
                 search: str | None = None) -> list[dict[str, Any]]:
        """Current memories, oldest first, filtered."""
        params = {k: v for k, v in dict(status=status, tag=tag, dream=dream, search=search).items() if v is not None}
        return self._call("GET", "/memories", params=params)["memories"]

    def memory(self, memory_id: str) -> dict[str, Any]:
        """One memory with its history and redactions."""
        return self._call("GET", f"/memories/{quote(memory_id, safe='')}")

    def review(self, memory_id: str, action: str, **fields: Any) -> dict[str, Any]:
        """A review action (accept, reject, edit, merge, retire, redact) as the authenticated user."""
        return self._call("PATCH", f"/memories/{quote(memory_id, safe='')}", {**fields, "action": action})

    def dreams(self) -> list[dict[str, Any]]:
        return self._call("GET", "/dreams")["dreams"]

    def dream(self, sessions: list[str] | None = None, model: str | None = None,
              instructions: str | None = None) -> str:
        """Start a dream in the server; returns its id (follow it like any session)."""
        body = {k: v for k, v in dict(sessions=sessions, model=model, instructions=instructions).items() if v is not None}
        return self._call("POST", "/dreams", body)["dream_id"]

    def _sid(self, session_id: str | None) -> str:
        sid = session_id or self.session_id
        if not sid:
            raise RequestRefused(400, "no session: pass a session id or ask() something first")
        return sid

    # -- the stream ------------------------------------------------------------------

    def stream(self, session_id: str, after: int = 0, timeout: float | None = None) -> Stream:
        """The session's websocket, connected now: iterate for {"kind": "event"|"delta", ...}."""
        return Stream(self, session_id, after, timeout)

    def turn(self, session_id: str, text: str, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Send text and yield the turn's stream messages, up to and including its turn_ended."""
        after = self.session(session_id)["last_seq"]
        with self.stream(session_id, after=after, timeout=timeout) as stream:
            # the socket is subscribed before the turn starts, so nothing is missed
            seq = self.send(session_id, text)
            for msg in stream:
                yield msg
                ev = msg["event"] if msg["kind"] == "event" else None
                if ev is not None and ev["type"] == "turn_ended" and ev["seq"] > seq:
                    return

    def ask(self, text: str, session: str | None = None, *, model: str | None = None, timeout: float | None = None) -> Answer:
        """Send text to a session (new on first use) and wait for the turn to end."""
        sid = session or self.session_id
        if sid is None:
            sid = self.create_session(title=text.strip()[:60], model=model)["id"]
        self.session_id = sid
        events = [m["event"] for m in self.turn(sid, text, timeout=timeout) if m["kind"] == "event"]
        stop = events[-1]["payload"].get("stop_reason") if events and events[-1]["type"] == "turn_ended" else None
        return Answer(sid, answer_text(events), stop, events)


class Stream:
    """An open event stream of one session (a websocket); iterate it, then close it."""

    def __init__(self, client: WorkbenchClient, session_id: str, after: int = 0, timeout: float | None = None):
        import websocket

        url = "ws" + client.api[len("http"):] + f"/sessions/{session_id}/stream?" + urlencode({"after": after})
        try:
            self.ws = websocket.create_connection(
                url, header=[f"{k}: {v}" for k, v in client.headers.items()], timeout=timeout, suppress_origin=True
            )
        except (OSError, websocket.WebSocketException) as e:
            raise ServerUnavailable(f"cannot open the event stream at {url.split('?')[0]}: {e}") from None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import websocket

        while True:
            try:
                raw = self.ws.recv()
            except websocket.WebSocketConnectionClosedException:
                return
            if not raw:
                return
            yield json.loads(raw)

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- finding the server ---------------------------------------------------------------


def find_server() -> tuple[str, str]:
    """(url, token) of the Jupyter server this kernel belongs to."""
    url = os.environ.get("WORKBENCH_URL")
    if url:
        return url, os.environ.get("WORKBENCH_TOKEN") or os.environ.get("JUPYTER_TOKEN", "")
    from jupyter_server.serverapp import list_running_servers

    servers = list(list_running_servers())
    by_pid = {info.get("pid"): info for info in servers}
    for pid in _ancestors():  # nearest first: the server that started this kernel
        if pid in by_pid:
            return by_pid[pid]["url"], by_pid[pid].get("token", "")
    if len(servers) == 1:
        return servers[0]["url"], servers[0].get("token", "")
    if not servers:
        raise ServerUnavailable(f"no running Jupyter server found for this kernel: {HOW_TO_FIX}")
    raise ServerUnavailable(
        f"{len(servers)} Jupyter servers are running and none started this kernel: pass workbench.connect(url=..., token=...)"
    )


def _ancestors() -> list[int]:
    """The pids of this process's parent, grandparent, ... (nearest first)."""
    try:
        import psutil

        return [p.pid for p in psutil.Process().parents()]
    except Exception:
        return [os.getppid()]


def connect(url: str | None = None, token: str | None = None) -> WorkbenchClient:
    """A client of this kernel's workbench server (or of `url`), checked to answer."""
    if url is None:
        url, found = find_server()
        token = token if token is not None else found
    elif token is None:
        token = os.environ.get("WORKBENCH_TOKEN") or os.environ.get("JUPYTER_TOKEN", "")
    client = WorkbenchClient(url, token)
    client.status()
    return client
