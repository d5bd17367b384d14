"""A client of the workbench server's REST and websocket API (docs/api.md).

It runs anywhere (a notebook kernel, a script) and never opens the DuckDB
file: the server owns it. `connect()` finds the Jupyter server this kernel
belongs to and its token, or takes them explicitly.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from ..errors import RequestRefused, ServerUnavailable

HOW_TO_FIX = (
    "start JupyterLab with the workbench extension enabled (`jupyter server extension enable workbench`), "
    "or pass workbench.connect(url=..., token=...)"
)


SEND_RETRIES = 2  # a message that got no answer is sent again (with its key) up to this often


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
        self.notebook_session: str | None = None  # the notebook's %agent session (connect() looks), for files

    def __repr__(self) -> str:
        return f"<WorkbenchClient {self.url}>"

    def close(self) -> None:
        self.http.close()

    # -- REST ----------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, params: dict | None = None, content: bytes | None = None,
              retries: int = 0) -> Any:
        """`retries`: how often a request that got no answer (a dropped connection, a timeout) is sent again,
        only for a request the server answers the same however often it gets it (a message with its key)."""
        import httpx

        for attempt in range(retries + 1):
            try:
                if content is not None:  # a file sent as it is (an import): the server reads and checks its bytes
                    r = self.http.request(method, self.api + path, content=content, params=params,
                                          headers={"Content-Type": "application/json"})
                else:
                    r = self.http.request(method, self.api + path, json=body, params=params)
                break
            except httpx.TransportError:
                if attempt < retries:
                    continue
                raise ServerUnavailable(f"no workbench server answers at {self.url} (no answer after {attempt + 1} "
                                        f"attempt(s)): {HOW_TO_FIX}") from None
            except httpx.HTTPError as e:
                raise ServerUnavailable(f"no workbench server answers at {self.url} ({type(e).__name__}): {HOW_TO_FIX}") from None
        if r.status_code == 404 and path == "/status":
            raise ServerUnavailable(
                f"the Jupyter server at {self.url} does not have the workbench extension enabled: "
                "run `jupyter server extension enable workbench` and restart it"
            )
        if r.status_code == 403:
            raise RequestRefused(403, f"the server at {self.url} refused the token; pass workbench.connect(url=..., token=...)")
        return self._checked(r)

    def _checked(self, r: Any) -> Any:
        """The JSON of a response, or RequestRefused with the server's one-line error."""
        if r.status_code >= 400:
            try:
                message = r.json().get("error") or r.text
            except ValueError:
                message = r.text[:200] or r.reason_phrase
            raise RequestRefused(r.status_code, message)
        return r.json()

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/status")

    def sessions(self, **filters: Any) -> list[dict[str, Any]]:
        """Sessions oldest first (or in `order`); filters as `sessions_page` takes them, every match."""
        return self._call("GET", "/sessions", params=_listing(filters))["sessions"]

    def sessions_page(self, *, limit: int = 50, cursor: str | None = None, **filters: Any) -> dict[str, Any]:
        """One page: {"sessions": [...], "next": cursor or None}. filters: kind, state (new, unfinished, ended),
        text (in the title), updated_after, updated_before (ISO 8601 or datetime), order (created, -created,
        updated, -updated). Pass `next` back as `cursor`, with the same filters, for the page after."""
        return self._call("GET", "/sessions", params=_listing({**filters, "limit": limit, "cursor": cursor}))

    def iter_sessions(self, *, page: int = 200, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every matching session, fetched a page at a time."""
        cursor = None
        while True:
            got = self.sessions_page(limit=page, cursor=cursor, **filters)
            yield from got["sessions"]
            cursor = got["next"]
            if cursor is None:
                return

    def children(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The sessions this session delegated to (`parent_id` is its id), oldest first."""
        sid = self._sid(session_id)
        return [s for s in self.sessions() if s.get("parent_id") == sid]

    def session(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/sessions/{session_id}")

    def create_session(
        self,
        title: str | None = None,
        model: str | None = None,
        system: str | None = None,
        config: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        id: str | None = None,
        first_message: str | None = None,
    ) -> dict[str, Any]:
        """Create a session; returns it (with its `id`, new unless given). `first_message`: the message
        about to be sent (not sent), what the session's memories are ranked by."""
        body = {k: v for k, v in dict(id=id, title=title, model=model, system=system, config=config, tools=tools,
                                      first_message=first_message).items() if v is not None}
        return self._call("POST", "/sessions", body)

    def send(self, session_id: str, text: str, *, key: str | None = None) -> int:
        """Start a turn; returns the seq of its user_message (the turn runs in the server). The message goes
        with an idempotency key (`key`, else a new one), and is sent again with it when the connection fails:
        the server records it once (docs/api.md, "Retrying safely")."""
        body = {"text": text, "idempotency_key": key or uuid.uuid4().hex}
        return self._call("POST", f"/sessions/{session_id}/messages", body, retries=SEND_RETRIES)["seq"]

    def events(self, session_id: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        params = {"after": after, **({"limit": limit} if limit else {})}
        return self._call("GET", f"/sessions/{session_id}/events", params=params)["events"]

    def notebook(self, session_id: str | None = None, path: str | Path | None = None) -> dict[str, Any]:
        """The session's code and outputs as a notebook (nbformat 4 JSON, docs/api.md); written to `path`
        (an .ipynb file, not overwritten if it exists) when given."""
        nb = self._call("GET", f"/sessions/{quote(self._sid(session_id), safe='')}/notebook")
        if path is not None:
            target = Path(path)
            with target.open("x", encoding="utf-8") as f:  # never overwrite a notebook of the user's
                json.dump(nb, f, ensure_ascii=False, indent=1)
        return nb

    def interrupt(self, session_id: str | None = None) -> bool:
        return self._call("POST", f"/sessions/{self._sid(session_id)}/interrupt", {})["interrupted"]

    def resume(self, session_id: str | None = None) -> bool:
        return self._call("POST", f"/sessions/{self._sid(session_id)}/resume", {})["resumed"]

    def hands(self, session_id: str | None = None) -> dict[str, Any]:
        return self._call("GET", f"/sessions/{self._sid(session_id)}/hands")

    def restart_hands(self, session_id: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/sessions/{self._sid(session_id)}/hands/restart", {})

    def close_hands(self, session_id: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/sessions/{self._sid(session_id)}/hands/close", {})

    # -- managing sessions ------------------------------------------------------

    def rename(self, session_id: str, title: str) -> dict[str, Any]:
        """Give a session a new title (recorded as `session_renamed`); its row after."""
        return self._call("PATCH", f"/sessions/{_part(session_id)}", {"title": title})

    def archive(self, session_id: str, archived: bool = True) -> dict[str, Any]:
        """Archive a session (archived=False: bring it back); its row after."""
        return self._call("PATCH", f"/sessions/{_part(session_id)}", {"archived": archived})

    def delete(self, session_id: str) -> dict[str, Any]:
        """Delete a session's events and rows for good (refused while a turn runs): {"deleted", "events"}."""
        return self._call("DELETE", f"/sessions/{_part(session_id)}", {})

    def fork(self, session_id: str, seq: int | None = None, *, id: str | None = None,
             title: str | None = None) -> dict[str, Any]:
        """A new session starting with a copy of this one's log up to `seq` (cut back to a turn boundary); its row."""
        body = {k: v for k, v in {"seq": seq, "id": id, "title": title}.items() if v is not None}
        return self._call("POST", f"/sessions/{_part(session_id)}/fork", body)

    def search(self, text: str, *, limit: int = 20, cursor: str | None = None, kind: str | None = None,
               archived: bool | None = None) -> dict[str, Any]:
        """Sessions whose title or messages hold text (any case): {"hits": [row + seq, type, snippet], "next"}."""
        params = {"q": text, "limit": limit, "cursor": cursor, "kind": kind,
                  "archived": None if archived is None else ("true" if archived else "false")}
        return self._call("GET", "/search", params={k: v for k, v in params.items() if v is not None})

    def usage(self, session_id: str | None = None) -> dict[str, Any]:
        """Tokens and estimated cost per turn and in total: {"turns", "total", "priced"}."""
        return self._call("GET", f"/sessions/{_part(self._sid(session_id))}/usage")

    def models(self) -> list[dict[str, Any]]:
        """The models a session may be created with (the default first), with their thinking and effort settings."""
        return self._call("GET", "/models")["models"]

    def query(self, sql: str, params: list[Any] | None = None) -> dict[str, Any]:
        """One read-only SQL statement against the session log: {"columns", "rows", "truncated"}."""
        return self._call("POST", "/query", {"sql": sql, "params": params or []})

    # -- files in a session's workspace (docs/notebook.md, "Data between notebook and agent") ---------------

    def put_file(self, session_id: str, path: str, data: Any, *, name: str | None = None, kind: str = "file") -> dict[str, Any]:
        """Write `data` (bytes or a binary file object, streamed) to `path` in the session's workspace;
        returns the `file_attached` record: name, path, bytes, sha256, kind, seq."""
        import httpx

        params = {"path": path, "kind": kind, **({"name": name} if name else {})}
        try:
            r = self.http.post(f"{self.api}/sessions/{quote(session_id, safe='')}/files", params=params, content=data,
                               headers={"Content-Type": "application/octet-stream"}, timeout=max(self.timeout, 300))
        except httpx.HTTPError as e:
            raise ServerUnavailable(f"the upload of {path!r} to {self.url} failed ({type(e).__name__}: {e})") from None
        return self._checked(r)

    def attach(self, session_id: str | None = None, *names: str, namespace: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Copy variables of `namespace` (by name) and files of this machine (by path) into the session's workspace,
        each by its type (docs/notebook.md); returns their `file_attached` records, each with a `note` for the agent."""
        from .data import pack_file, pack_value

        sid = self._fsid(session_id)
        namespace = namespace if namespace is not None else {}
        packed = []
        try:
            for n in names:
                if n.isidentifier() and n in namespace:
                    packed.append(pack_value(n, namespace[n]))
                elif os.path.isfile(n):
                    packed.append(pack_file(n))
                else:
                    raise RequestRefused(400, f"{n!r} is neither a variable of this notebook nor a file")
            records: list[dict[str, Any]] = []
            for p in packed:
                try:
                    records.append({**self.put_file(sid, p.path, p.stream, name=p.name, kind=p.kind), "note": p.describe})
                except RequestRefused as e:
                    done = f" (attached before it: {', '.join(r['path'] for r in records)})" if records else ""
                    raise RequestRefused(e.status, f"cannot attach {p.name!r} as {p.path!r}: {e.message}{done}") from None
        finally:
            for p in packed:
                p.stream.close()
        return records

    def files(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The session's workspace: [{"path", "type" (file, dir, link, other), "bytes", "mtime"}], sorted by path."""
        return self._call("GET", f"/sessions/{quote(self._fsid(session_id), safe='')}/files")["files"]

    def get(self, session_id: str | None, path: str | None = None, *, max_bytes: int | None = None) -> bytes:
        """The bytes of a file in the session's workspace (the server sends at most its max_download_mb;
        `max_bytes` refuses a bigger one here, before it is all read). `get(path)`: of the current session."""
        import httpx

        if path is None:
            session_id, path = None, session_id
        if not path:
            raise RequestRefused(400, "give the path of a file in the session's workspace")

        url = f"{self.api}/sessions/{quote(self._fsid(session_id), safe='')}/files/content"
        try:
            with self.http.stream("GET", url, params={"path": path}) as r:
                if r.status_code >= 400:
                    r.read()
                    self._checked(r)
                declared = int(r.headers.get("X-Workbench-Bytes") or 0)
                if max_bytes is not None and declared > max_bytes:
                    raise RequestRefused(413, f"{path!r} is {declared:,} bytes, more than max_bytes={max_bytes:,}")
                chunks, size = [], 0
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise RequestRefused(413, f"{path!r} is more than max_bytes={max_bytes:,} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.HTTPError as e:
            raise ServerUnavailable(f"fetching {path!r} from {self.url} failed ({type(e).__name__}: {e})") from None

    def load(self, session_id: str | None, path: str | None = None, *, allow_pickle: bool = False,
             max_bytes: int | None = None) -> Any:
        """A file of the session's workspace as a Python value, by its type: parquet/csv → DataFrame, npy → array,
        json → its value, images → an IPython Image, text → str, else bytes. A pickle only with allow_pickle=True.
        `load(path)`: of the current session."""
        from .data import loads

        if path is None:
            session_id, path = None, session_id
        if not path:
            raise RequestRefused(400, "give the path of a file in the session's workspace")

        return loads(path, self.get(session_id, path, max_bytes=max_bytes), allow_pickle=allow_pickle)

    # -- memory (the memory plugin's routes) -------------------------------------------

    def memories(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None,
                 search: str | None = None, store: str | None = None) -> list[dict[str, Any]]:
        """Current memories, oldest first, filtered (store: only that store's)."""
        params = {k: v for k, v in dict(status=status, tag=tag, dream=dream, search=search, store=store).items() if v is not None}
        return self._call("GET", "/memories", params=params)["memories"]

    def export_memories(self, store: str = "default") -> dict[str, Any]:
        """Store `store` as the export format: every memory with its whole history (docs/memory.md, "Stores")."""
        return self._call("GET", "/memories/export", params={"store": store})

    def import_memories(self, data: bytes, store: str | None = None, allow_secret: bool = False,
                        review: bool = False) -> dict[str, Any]:
        """Import an export's bytes into `store` (default: the file's), all or nothing; the report. `review`:
        accepted memories come in as proposals for a person to accept here."""
        params = {k: v for k, v in dict(store=store, allow_secret="true" if allow_secret else None,
                                        review="true" if review else None).items() if v is not None}
        return self._call("POST", "/memories/import", params=params, content=data)

    def memory(self, memory_id: str) -> dict[str, Any]:
        """One memory with its history and redactions."""
        return self._call("GET", f"/memories/{quote(memory_id, safe='')}")

    def review(self, memory_id: str, action: str, **fields: Any) -> dict[str, Any]:
        """A review action (accept, reject, edit, merge, retire, redact, supersede with by=) as the authenticated user."""
        return self._call("PATCH", f"/memories/{quote(memory_id, safe='')}", {**fields, "action": action})

    def recall(self, query: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Accepted memories ranked by relevance to the query (as the `recall` tool finds them), each with its score."""
        params = {"q": query, **({"limit": str(limit)} if limit is not None else {})}
        return self._call("GET", "/recall", params=params)["memories"]

    def dreams(self) -> list[dict[str, Any]]:
        return self._call("GET", "/dreams")["dreams"]

    def dream_status(self, dream_id: str) -> dict[str, Any]:
        """A dream's state (running, done, stopped, cancelled, unfinished), what it read and proposed."""
        return self._call("GET", f"/dreams/{dream_id}")

    def cancel_dream(self, dream_id: str) -> dict[str, Any]:
        """Cancel a dream: no later chunk runs and its running chunk is interrupted; its status."""
        return self._call("POST", f"/dreams/{dream_id}/cancel", {})

    def dream(self, sessions: list[str] | None = None, model: str | None = None,
              instructions: str | None = None, store: str | None = None) -> str:
        """Start a dream in the server that proposes into `store` (default: dream_store); returns its id."""
        body = {k: v for k, v in dict(sessions=sessions, model=model, instructions=instructions, store=store).items()
                if v is not None}
        return self._call("POST", "/dreams", body)["dream_id"]

    # -- evals (the evals plugin's routes) ------------------------------------------------

    def eval(self, tasks: Any, models: str | list[str], *, epochs: int = 1, parallel: int | None = None,
             run: str | None = None, progress: bool = True, poll: float = 0.5) -> Any:
        """Run every task × model × epoch in the server and wait; a DataFrame of the attempts (docs/evals.md).

        `tasks`: a task set file (read here, its files sent along) or Tasks / their JSON objects.
        A progress bar shows while it runs (tqdm, when installed); interrupting the kernel
        interrupts the run (finished attempts stay finished: `run=` the same id goes on with it).
        """
        import time

        from ..evals.results import frame
        from ..evals.tasks import load_tasks, task_to_json

        body: dict[str, Any] = {"tasks": [task_to_json(t) for t in load_tasks(tasks)],
                                "models": [models] if isinstance(models, str) else list(models), "epochs": epochs}
        body.update({k: v for k, v in dict(parallel=parallel, run=run).items() if v is not None})
        started = self._call("POST", "/evals", body)
        run_id, bar = started["run"], None
        if progress:
            try:
                from tqdm.auto import tqdm

                bar = tqdm(total=started["total"], desc=run_id, unit="attempt")
            except ImportError:
                bar = None
        try:
            while True:
                st = self._call("GET", f"/evals/{quote(run_id, safe='')}")
                if bar is not None:
                    bar.update(st["finished"] - bar.n)
                if st["state"] != "running":
                    break
                time.sleep(poll)
        except KeyboardInterrupt:
            self._call("POST", f"/evals/{quote(run_id, safe='')}/interrupt", {})
            raise
        finally:
            if bar is not None:
                bar.close()
        if st["state"] == "failed":
            raise RequestRefused(500, f"eval run {run_id} failed: {st['error']}")
        df = frame(st["results"])
        df.attrs["run"] = run_id
        return df

    def eval_runs(self) -> list[dict[str, Any]]:
        """Every eval run in the server's log."""
        return self._call("GET", "/evals")["runs"]

    def eval_results(self, run: str) -> Any:
        """A DataFrame of one run's attempts."""
        from ..evals.results import frame

        df = frame(self._call("GET", f"/evals/{quote(run, safe='')}")["results"])
        df.attrs["run"] = run
        return df

    def eval_report(self, df: Any, other: Any = None) -> Any:
        """A Panel view of a run's DataFrame (and a second one beside it), each attempt's transcript one click away."""
        from ..evals.report import report_panel

        return report_panel(df, lambda sid: self.events(sid), other)

    def _fsid(self, session_id: str | None) -> str:
        """The session a files call is about: the one given, else ask()'s, else the notebook's %agent session."""
        return self._sid(session_id or self.session_id or self.notebook_session)

    def _sid(self, session_id: str | None) -> str:
        sid = session_id or self.session_id
        if not sid:
            raise RequestRefused(400, "no session: pass a session id or ask() something first")
        return sid

    # -- the stream ------------------------------------------------------------------

    def stream(self, session_id: str, after: int = 0, timeout: float | None = None) -> Stream:
        """The session's websocket, connected now: iterate for {"kind": "event"|"delta"|"output", ...}."""
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
            sid = self.create_session(model=model, first_message=text)["id"]  # untitled: its first message names it
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


def _part(session_id: str) -> str:
    """A session id as one path segment (an id with a slash or a space must not name another route)."""
    return quote(session_id, safe="")


def _listing(filters: dict[str, Any]) -> dict[str, Any]:
    """The query arguments of GET /sessions for a listing's filters (text is `q`; datetimes in ISO 8601)."""
    out: dict[str, Any] = {}
    for name, value in filters.items():
        if value is None:
            continue
        if isinstance(value, datetime):
            value = value.isoformat()
        if isinstance(value, bool):
            value = "true" if value else "false"
        out["q" if name == "text" else name] = value
    return out


def connect(url: str | None = None, token: str | None = None) -> WorkbenchClient:
    """A client of this kernel's workbench server (or of `url`), checked to answer."""
    if url is None:
        url, found = find_server()
        token = token if token is not None else found
    elif token is None:
        token = os.environ.get("WORKBENCH_TOKEN") or os.environ.get("JUPYTER_TOKEN", "")
    client = WorkbenchClient(url, token)
    client.status()
    client.notebook_session = _notebook_session()
    return client


def _notebook_session() -> str | None:
    """The session this notebook's %agent magics talk to, if they are loaded and have one."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        magic = shell.find_magic("agent") if shell is not None else None
        return getattr(getattr(magic, "__self__", None), "session_id", None)
    except Exception:
        return None
