"""A client of the workbench server's REST and websocket API (docs/api.md).

It runs anywhere (a notebook kernel, a script) and never opens the DuckDB
file: the server owns it. `connect()` finds the Jupyter server this kernel
belongs to and its token, or takes them explicitly. It is the service's REST
transport (workbench/service/rest.py) seen from synchronous code: the service
runs on a loop in a thread of its own, off the kernel's loop, and each method
waits for its operation; Ctrl-C (a kernel interrupt) cancels it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import PluginError, RequestRefused, ServerUnavailable
from ..service import Blocking
from ..service.rest import HOW_TO_FIX, Rest

if TYPE_CHECKING:
    from ..plugins import Plugin

T = TypeVar("T")


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


def plugin_methods(plugins: Sequence[Plugin]) -> dict[str, Callable[..., Any]]:
    """The notebook client's methods the plugins add, by name; two of one name, or one of a method the client has,
    are refused (PluginError naming both)."""
    out: dict[str, tuple[str, Callable[..., Any]]] = {}
    for p in plugins:
        for name, fn in p.client().items():
            if name.startswith("_") or hasattr(WorkbenchClient, name):
                raise PluginError(f"plugin {p.name!r} adds the client method {name!r}, which the client has already")
            if name in out:
                raise PluginError(f"plugins {out[name][0]!r} and {p.name!r} both add the client method {name!r}")
            out[name] = (p.name, fn)
    return {name: fn for name, (_, fn) in out.items()}


class WorkbenchClient:
    """The workbench API of one Jupyter server, over HTTP and a websocket."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token or ""
        self.timeout = timeout
        self.session_id: str | None = None  # the default session of ask()
        self.notebook_session: str | None = None  # the notebook's %agent session (connect() looks), for files
        self._service: Blocking[Rest] = Blocking(lambda: Rest(self.url, self.token, timeout=timeout)).open()

    def __repr__(self) -> str:
        return f"<WorkbenchClient {self.url}>"

    def close(self) -> None:
        self._service.close()

    def _run(self, fn: Callable[[Rest], Awaitable[T]]) -> T:
        return self._service.run(fn)

    # -- REST ----------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, params: dict | None = None,
             content: bytes | None = None) -> Any:
        """A route of the API that the service has no operation for (a plugin's: memories, dreams, evals)."""
        return self._service.run(lambda s: s.call(method, path, body, params=params, content=content))

    # -- the plugins' methods (wb.memories(), wb.eval(...): Plugin.client()) ------------

    @functools.cached_property
    def _plugin_methods(self) -> dict[str, Callable[..., Any]]:
        # loaded at the first plugin method, not at import: the plugins import the brain's parts a notebook's
        # `import workbench` does not need
        from ..plugins.loading import load_plugins

        return plugin_methods(load_plugins())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never a plugin's, and not looked up while the object is half made
            raise AttributeError(name)
        fn = self._plugin_methods.get(name)
        if fn is None:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r} (and no plugin adds one)")
        return functools.update_wrapper(functools.partial(fn, self), fn)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._plugin_methods})

    def status(self) -> dict[str, Any]:
        return self._run(lambda s: s.status())

    def sessions(self, **filters: Any) -> list[dict[str, Any]]:
        """Sessions oldest first (or in `order`); filters as `sessions_page` takes them, every match."""
        return self._run(lambda s: s.sessions(**filters))["sessions"]

    def sessions_page(self, *, limit: int = 50, cursor: str | None = None, **filters: Any) -> dict[str, Any]:
        """One page: {"sessions": [...], "next": cursor or None}. filters: kind, state (new, unfinished, ended),
        text (in the title), updated_after, updated_before (ISO 8601 or datetime), order (created, -created,
        updated, -updated). Pass `next` back as `cursor`, with the same filters, for the page after."""
        return self._run(lambda s: s.sessions(limit=limit, cursor=cursor, **filters))

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
        return self._run(lambda s: s.session(session_id))

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
        return self._run(lambda s: s.create_session(id=id, title=title, model=model, system=system, config=config,
                                                    tools=tools, first_message=first_message))

    def send(self, session_id: str, text: str, *, key: str | None = None,
             attachments: list[dict[str, Any]] | None = None) -> int:
        """Start a turn; returns the seq of its user_message (the turn runs in the server). The message goes
        with an idempotency key (`key`, else a new one), and is sent again with it when the connection fails:
        the server records it once (docs/api.md, "Retrying safely"). `attachments`: notebook cells sent with
        it (docs/api.md, "Notebook context")."""
        return self._run(lambda s: s.send(session_id, text, key=key, attachments=attachments))

    def events(self, session_id: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return [e.to_json() for e in self._run(lambda s: s.events(session_id, after, limit))]

    def notebook(self, session_id: str | None = None, path: str | Path | None = None) -> dict[str, Any]:
        """The session's code and outputs as a notebook (nbformat 4 JSON, docs/api.md); written to `path`
        (an .ipynb file, not overwritten if it exists) when given."""
        sid = self._sid(session_id)
        nb = self._run(lambda s: s.notebook(sid))
        if path is not None:
            target = Path(path)
            with target.open("x", encoding="utf-8") as f:  # never overwrite a notebook of the user's
                json.dump(nb, f, ensure_ascii=False, indent=1)
        return nb

    def interrupt(self, session_id: str | None = None) -> bool:
        sid = self._sid(session_id)
        return self._run(lambda s: s.interrupt(sid))

    def resume(self, session_id: str | None = None) -> bool:
        sid = self._sid(session_id)
        return self._run(lambda s: s.resume(sid))

    def hands(self, session_id: str | None = None) -> dict[str, Any]:
        sid = self._sid(session_id)
        return self._run(lambda s: s.hands(sid))

    def restart_hands(self, session_id: str | None = None) -> dict[str, Any]:
        sid = self._sid(session_id)
        return self._run(lambda s: s.restart_hands(sid))

    def close_hands(self, session_id: str | None = None) -> dict[str, Any]:
        sid = self._sid(session_id)
        return self._run(lambda s: s.close_hands(sid))

    # -- managing sessions ------------------------------------------------------

    def rename(self, session_id: str, title: str) -> dict[str, Any]:
        """Give a session a new title (recorded as `session_renamed`); its row after."""
        return self._run(lambda s: s.rename(session_id, title))

    def archive(self, session_id: str, archived: bool = True) -> dict[str, Any]:
        """Archive a session (archived=False: bring it back); its row after."""
        return self._run(lambda s: s.archive(session_id, archived))

    def delete(self, session_id: str) -> dict[str, Any]:
        """Delete a session's events and rows for good (refused while a turn runs): {"deleted", "events"}."""
        return self._run(lambda s: s.delete(session_id))

    def fork(self, session_id: str, seq: int | None = None, *, id: str | None = None,
             title: str | None = None) -> dict[str, Any]:
        """A new session starting with a copy of this one's log up to `seq` (cut back to a turn boundary); its row."""
        return self._run(lambda s: s.fork(session_id, seq, new_id=id, title=title))

    def search(self, text: str, *, limit: int = 20, cursor: str | None = None, kind: str | None = None,
               archived: bool | None = None) -> dict[str, Any]:
        """Sessions whose title or messages hold text (any case): {"hits": [row + seq, type, snippet], "next"}."""
        return self._run(lambda s: s.search(text, limit=limit, cursor=cursor, kind=kind, archived=archived))

    def usage(self, session_id: str | None = None) -> dict[str, Any]:
        """Tokens and estimated cost per turn and in total: {"turns", "total", "priced"}."""
        sid = self._sid(session_id)
        return self._run(lambda s: s.usage(sid))

    def models(self) -> list[dict[str, Any]]:
        """The models a session may be created with (the default first), with their thinking and effort settings."""
        return self._run(lambda s: s.models())["models"]

    def query(self, sql: str, params: list[Any] | None = None) -> dict[str, Any]:
        """One read-only SQL statement against the session log: {"columns", "rows", "truncated"}."""
        return self._run(lambda s: s.query(sql, params or []))

    # -- files in a session's workspace (docs/notebook.md, "Data between notebook and agent") ---------------

    def put_file(self, session_id: str, path: str, data: Any, *, name: str | None = None, kind: str = "file") -> dict[str, Any]:
        """Write `data` (bytes or a binary file object, streamed) to `path` in the session's workspace;
        returns the `file_attached` record: name, path, bytes, sha256, kind, seq."""
        return self._run(lambda s: s.put_file(session_id, path, data, name=name or "", kind=kind))

    def attach(self, session_id: str | None = None, *names: str, namespace: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Copy variables of `namespace` (by name) and files of this machine (by path) into the session's workspace,
        each by its type (docs/notebook.md); returns their `file_attached` records, each with a `note` for the agent
        (and a `warning` for the person when a value went in another form than expected: a pickle, not Parquet)."""
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
                    records.append({**self.put_file(sid, p.path, p.stream, name=p.name, kind=p.kind), "note": p.describe,
                                    **({"warning": p.warning} if p.warning else {})})
                except RequestRefused as e:
                    done = f" (attached before it: {', '.join(r['path'] for r in records)})" if records else ""
                    raise RequestRefused(e.status, f"cannot attach {p.name!r} as {p.path!r}: {e.message}{done}") from None
        finally:
            for p in packed:
                p.stream.close()
        return records

    def files(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The session's workspace: [{"path", "type" (file, dir, link, other), "bytes", "mtime"}], sorted by path."""
        sid = self._fsid(session_id)
        return self._run(lambda s: s.files(sid))["files"]

    def get(self, session_id: str | None, path: str | None = None, *, max_bytes: int | None = None) -> bytes:
        """The bytes of a file in the session's workspace (the server sends at most its max_download_mb;
        `max_bytes` refuses a bigger one here, before it is all read). `get(path)`: of the current session."""
        if path is None:
            session_id, path = None, session_id
        if not path:
            raise RequestRefused(400, "give the path of a file in the session's workspace")
        sid, where = self._fsid(session_id), path
        return self._run(lambda s: s.read_file(sid, where, max_bytes=max_bytes))

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
        self._service = client._service
        self._opened = client._service.service.stream(session_id, after, timeout)
        self._messages = self._service.run(lambda _: self._opened.__aenter__())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for m in self._service.iterate(self._messages):
            yield m.to_json()

    def close(self) -> None:
        self._service.run(lambda _: self._opened.__aexit__(None, None, None))

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
    servers = running_servers()
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


def running_servers(runtime_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Every running Jupyter server's info, as its `jpserver-*.json` in the runtime directory gives it.

    What jupyter_server's `list_running_servers` reads, without importing the server (a second of CPU for each
    CLI command that goes through one). A file that is not a server's info (not JSON, not an object, no url) is
    passed over, and so is the file of a server that is gone (left where it is: it is Jupyter's to remove).
    """
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    try:
        names = sorted(os.listdir(runtime_dir))
    except OSError:
        return []
    out = []
    for name in names:
        if not (name.startswith("jpserver-") and name.endswith(".json")):
            continue
        try:
            info = json.loads(Path(runtime_dir, name).read_bytes())
        except (OSError, ValueError, RecursionError):  # being written, unreadable, not UTF-8, not JSON, nested deep
            continue
        if isinstance(info, dict) and isinstance(info.get("url"), str) and _alive(info.get("pid")):
            out.append(info)
    return out


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    except OSError:
        return False
    return True


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
    notice = hands_notice(client.status())
    if notice:  # where the code a model writes will run is said where the person connects, not only in a log
        print(notice, file=sys.stderr)
    client.notebook_session = _notebook_session()
    return client


def hands_notice(status: dict[str, Any]) -> str:
    """The line a notebook shows when the server's hands are not in a sandbox of their own (else "")."""
    sandbox = (status.get("sandbox") or {}).get("sandbox") or {}
    mode = sandbox.get("mode")
    if mode not in ("container", "unsafe", "refused"):
        return ""
    return f"workbench: {sandbox.get('message') or mode}"


def _notebook_session() -> str | None:
    """The session this notebook's %agent magics talk to, if they are loaded and have one."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        magic = shell.find_magic("agent") if shell is not None else None
        return getattr(getattr(magic, "__self__", None), "session_id", None)
    except Exception:
        return None
