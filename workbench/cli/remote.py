"""The CLI beside a running server: when a workbench server holds the database, commands go through its API.

DuckDB lets one process write a database file, and a Jupyter server with the workbench
extension holds it for as long as it runs. A command that finds the file held
(DatabaseLocked) looks for the server that holds it the way `workbench.connect()`
does (the Jupyter runtime dir's server files, with their tokens), checks that its
`GET /status` names the same database, and runs through the REST API and the
session websocket instead, printing what it prints locally.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    DatabaseLocked,
    RequestRefused,
    ServerUnavailable,
    UnknownSession,
    WorkbenchError,
)
from ..log.events import Event
from ..service import event_of

if TYPE_CHECKING:
    from ..client.api import WorkbenchClient

EVENTS_PAGE = 100_000


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def find_holder(db: str | Path | None, locked: DatabaseLocked) -> WorkbenchClient | None:
    """A client of the running workbench server that holds `db`, or None when none does."""
    from ..client.api import WorkbenchClient, running_servers
    from ..log import default_db_path

    path = Path(db) if db is not None else default_db_path()
    servers = running_servers()
    # the process DuckDB names as the holder first; any other server on this machine may be it too
    servers.sort(key=lambda info: info.get("pid") != locked.holder_pid)
    for info in servers:
        client = WorkbenchClient(info["url"], info.get("token", ""), timeout=60.0)
        try:
            status = client.status()
        except WorkbenchError:
            client.close()
            continue
        if _same_file(status.get("db") or "", path):
            return client
        client.close()
    return None


class Remote:
    """What a command run through a server gets: the client, and the errors of its answers as local ones."""

    def __init__(self, client: WorkbenchClient, plugins: list[Any], db: str | Path | None = None):
        self.client = client
        self.plugins = plugins
        self.db = db  # the database the server holds (None: the default one)

    def reattach(self, wait: float, poll: float = 1.0) -> None:
        """Go on with the server that holds the database now (one started again after a crash: another port and
        token), waiting up to `wait` seconds for one; ServerUnavailable when none holds it by then."""
        deadline = time.monotonic() + wait
        while True:
            client = find_holder(self.db, DatabaseLocked("held"))
            if client is not None:
                self.client.close()
                self.client = client
                return
            if time.monotonic() >= deadline:
                raise ServerUnavailable(f"no workbench server holds the database again after {wait:.0f} s; start one, "
                                        "or run the command on the file")
            time.sleep(poll)

    @contextmanager
    def answers(self, unknown: type[WorkbenchError] = UnknownSession) -> Iterator[None]:
        """Turn the server's refusals into the errors a local run raises (404: `unknown`), same words."""
        try:
            yield
        except RequestRefused as e:
            local = RequestRefused(e.status, e.message, unknown).as_local()
            if isinstance(local, RequestRefused):
                raise
            raise local from None

    def session(self, session_id: str) -> dict[str, Any] | None:
        """The session's row as the log gives it (without the server's `running`), or None if there is none."""
        try:
            row = self.client.session(session_id)
        except RequestRefused as e:
            if e.status == 404:
                return None
            raise
        row.pop("running", None)
        return row

    def events(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """A session's events after `after` as Events (all of them, page by page, unless `limit`)."""
        out: list[Event] = []
        with self.answers():
            while True:
                page = self.client.events(session_id, after=after, limit=min(limit or EVENTS_PAGE, EVENTS_PAGE))
                out += [event_of(e) for e in page]
                if not page or len(page) < EVENTS_PAGE or (limit is not None and len(out) >= limit):
                    return out[:limit] if limit is not None else out
                after = page[-1]["seq"]

    def follow(self, session_id: str, after: int, start: Callable[[], int | None], on_event: Callable[[Event], None],
               on_delta: Callable[[str, dict[str, Any]], None] | None = None,
               on_output: Callable[[str, dict[str, Any]], None] | None = None) -> str | None:
        """Open the session's stream after `after`, call start() (which starts a turn: the seq after which its
        turn_ended counts, or None when it started nothing), and hear the turn until it ends: its stop reason.
        Deltas and a running call's live output go to their callbacks; messages of other kinds are skipped."""
        with self.client.stream(session_id, after=after) as stream:
            with self.answers():
                since = start()
            if since is None:
                return None
            for msg in stream:
                kind = msg.get("kind")
                if kind == "delta":
                    if on_delta is not None:
                        on_delta(msg.get("session_id") or session_id, msg["event"])
                    continue
                if kind == "output":
                    if on_output is not None:
                        on_output(msg.get("session_id") or session_id, msg)
                    continue
                if kind != "event":
                    continue
                ev = event_of(msg["event"])
                on_event(ev)
                if ev.type == "turn_ended" and ev.seq > since:
                    return str(ev.payload.get("stop_reason"))
        raise WorkbenchError(f"the server closed the stream of session {session_id} before the turn ended; "
                             f"see `workbench show {session_id}`")

    def interrupt(self, session_id: str) -> None:
        try:
            self.client.interrupt(session_id)
        except WorkbenchError:
            pass  # the server is gone or the turn ended: nothing left to interrupt


def run_remote(args: argparse.Namespace, plugins: list[Any], command: Any, locked: DatabaseLocked) -> int:
    """Run `command` through the server holding the database; DatabaseLocked again when no server holds it."""
    remote = getattr(command, "remote", None)
    client = find_holder(getattr(args, "db", None), locked) if remote is not None else None
    if remote is None or client is None:
        raise locked
    print(f"[the database is held by the workbench server at {client.url}: going through its API]", file=sys.stderr)
    r = Remote(client, plugins, getattr(args, "db", None))
    try:
        return int(remote(args, r))
    finally:
        r.client.close()


__all__ = ["Remote", "event_of", "find_holder", "run_remote"]
