"""The in-process transport: every operation of the service over a Host (its log, brain, hands and plugins).

The server's handlers call it; so does the CLI when it holds the database file itself. DuckDB
work runs on the log's writer thread or in worker threads, never on the event loop. The host
starts (reaps orphans, warms the pool, starts the plugins) when the first operation that needs
it running comes (`ready`): bad input is refused before a kernel starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from ..config import from_env
from ..errors import ConfigError, TurnBusy, WorkbenchError
from ..hands import files as wsfiles
from ..hands.base import Hands
from ..hands.files import FilesSettings
from ..host import Host
from ..log.events import Event
from ..usage import session_usage
from .base import Message, Watch
from .parts import checked, no_part

T = TypeVar("T")

USAGE_TYPES = ("session_created", "user_message", "assistant_turn")  # what a session's usage is read from


def _checked_attachments(value: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A message's attachments, checked (checks.py: pydantic, imported by the first message that has some)."""
    if value is None:
        return None
    from ..checks import check_attachments

    return check_attachments(value)


def _checked_listing(fn: Callable[[], T]) -> T:
    """A ValueError of the log (a bad filter, cursor or argument) is a ConfigError: a 400, exit 2."""
    try:
        return fn()
    except ValueError as e:
        raise ConfigError(str(e)) from None


class Local:
    """The service over a Host of this process."""

    def __init__(self, host: Host, *, files: FilesSettings | None = None, logger: logging.Logger | None = None):
        self.host = host
        self.logger = logger or logging.getLogger("workbench.service")
        self.log = host.log
        self.brain = host.brain
        self.turns = host.brain.turns  # whether a session is at work: the one place that knows
        self.files_settings = files or from_env(FilesSettings, prefix="WORKBENCH_FILES_")
        self._started: asyncio.Future | None = None
        self._parts: dict[str, object] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, db: str | Path | None = None, **build: Any) -> AsyncIterator[Local]:
        """A host of its own over `db` (Host.build's arguments), closed when the block ends."""
        host = Host.build(db, **build)
        try:
            yield cls(host)
        finally:
            await host.close()

    async def ready(self) -> None:
        """Start the host once (reap orphaned kernels, warm the hands pool, start the plugins)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self.host.start())
        await asyncio.shield(self._started)

    # -- the host ------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        return self.host.status()

    async def models(self) -> dict[str, Any]:
        # off the loop: with a key, the first listing asks the Models API (up to its timeout)
        choices = await asyncio.to_thread(self.host.model_choices)
        return {"models": choices, "default": self.host.models.default_name()}

    # -- sessions ------------------------------------------------------------------------------

    def _row(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "running": self.turns.at_work(row["id"])}

    async def sessions(self, *, limit: int | None = None, cursor: str | None = None, **filters: Any) -> dict[str, Any]:
        given = {k: v for k, v in filters.items() if v is not None}

        def read() -> dict[str, Any]:
            if limit is None and cursor is None:
                return {"sessions": self.log.sessions(**given), "next": None}
            return self.log.sessions_page(limit=limit or 50, cursor=cursor, **given)

        page = await asyncio.to_thread(_checked_listing, read)
        return {"sessions": [self._row(s) for s in page["sessions"]], "next": page["next"]}

    async def session(self, session_id: str) -> dict[str, Any]:
        return self._row(await asyncio.to_thread(self.log.session, session_id))

    async def create_session(self, *, id: str | None = None, title: str | None = None, model: str | None = None,
                             system: str | None = None, config: Mapping[str, Any] | None = None,
                             tools: Sequence[str] | None = None, first_message: str | None = None) -> dict[str, Any]:
        # off the loop: checking a model name may import and set up the Anthropic SDK (seconds)
        from ..checks import session_args  # pydantic: imported by the first session made, not by every CLI command

        kw = await asyncio.to_thread(lambda: session_args(self.host, id=id, title=title, model=model, system=system,
                                                          config=config, tools=tools, first_message=first_message))
        return self._row(await asyncio.to_thread(lambda: self.brain.create_session(**kw)))

    async def events(self, session_id: str, after: int | None = None, limit: int | None = None) -> list[Event]:
        def read() -> list[Event]:
            self.log.session(session_id)
            return self.log.events(session_id, after, limit=limit)

        return await asyncio.to_thread(read)

    async def notebook(self, session_id: str) -> dict[str, Any]:
        from ..export import session_notebook

        session = await self.session(session_id)
        events = await self.events(session_id)
        return await asyncio.to_thread(session_notebook, session, events)

    async def usage(self, session_id: str) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            row = self.log.session(session_id)
            events = self.log.events(session_id, types=list(USAGE_TYPES))
            return {"session_id": session_id, **session_usage(events, self.host.prices, row["model"])}

        return await asyncio.to_thread(read)

    async def rename(self, session_id: str, title: str) -> dict[str, Any]:
        await asyncio.to_thread(self.log.rename_session, session_id, title)
        return await self.session(session_id)

    async def archive(self, session_id: str, archived: bool = True) -> dict[str, Any]:
        await asyncio.to_thread(self.log.archive_session, session_id, archived)
        return await self.session(session_id)

    async def delete(self, session_id: str) -> dict[str, Any]:
        await self.session(session_id)  # UnknownSession first
        if self.turns.at_work(session_id):
            raise TurnBusy(f"a turn is running in session {session_id}; interrupt it before deleting the session")
        # its hands first: stopping them records hands_stopped, which must not land after the delete
        await self.brain.close_session(session_id)
        # in the writer's transaction again: a turn that started since is seen there (its user_message is committed)
        n = await asyncio.to_thread(self.log.delete_session, session_id, busy=self.turns.at_work)
        await self.brain.close_session(session_id)  # whatever a request made of it meanwhile
        return {"deleted": session_id, "events": n}

    async def fork(self, session_id: str, seq: int | None = None, *, new_id: str | None = None,
                   title: str | None = None) -> dict[str, Any]:
        new = new_id or uuid.uuid4().hex[:12]

        def fork() -> dict[str, Any]:
            _checked_listing(lambda: self.log.fork_session(session_id, seq, new_id=new, title=title))
            return self.log.session(new)

        return self._row(await asyncio.to_thread(fork))

    async def search(self, text: str, *, limit: int = 20, cursor: str | None = None, kind: str | None = None,
                     archived: bool | None = None) -> dict[str, Any]:
        kw: dict[str, Any] = {"limit": limit, "cursor": cursor, "kind": kind, "archived": archived}
        page = await asyncio.to_thread(_checked_listing, lambda: self.log.search(text, **kw))
        return {"hits": [self._row(h) for h in page["hits"]], "next": page["next"]}

    async def query(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any]:
        log = self.log.sql()
        if log is None:
            raise ConfigError("this session log keeps no SQL tables (the in-memory log of tests): query needs a "
                              "DuckDB file")
        res = await asyncio.to_thread(log.query, sql, list(params))
        return {"columns": res.columns, "rows": [list(r) for r in res.rows], "truncated": res.truncated}

    # -- turns ---------------------------------------------------------------------------------

    async def send(self, session_id: str, text: str, *, key: str | None = None,
                   attachments: Sequence[Mapping[str, Any]] | None = None) -> int:
        """A session without a title is named after its first message (`session_renamed`, auto), committed with
        the message itself: a refused message names nothing."""
        attached = _checked_attachments(attachments)
        await self.ready()
        self._not_driven(session_id)
        return (await self.brain.start_turn(session_id, text, name_untitled=True, key=key, attachments=attached)).seq

    def _not_driven(self, session_id: str) -> None:
        """TurnBusy if a plugin goes on with the session between its turns: a turn started now would take
        the place of its next one (a dream's next chunk, an eval attempt's next turn), which then fails."""
        if self.turns.driven(session_id):
            raise TurnBusy(f"session {session_id} is at work between its turns (a dream between two chunks, or an "
                           "eval attempt being graded): wait until it is done, or cancel it")

    async def resume(self, session_id: str) -> bool:
        await self.ready()
        if await self.host.resumed_by_plugin(session_id):
            self.host.background(self.host.resume(session_id))
            return True
        self._not_driven(session_id)
        return await self.brain.start_resume(session_id)

    async def interrupt(self, session_id: str) -> bool:
        return await self.brain.interrupt(session_id)

    async def run_turn(self, session_id: str, text: str, watch: Watch, *,
                       attachments: Sequence[Mapping[str, Any]] | None = None) -> str:
        attached = _checked_attachments(attachments)
        await self.ready()
        with self._hearing(session_id, watch):
            # a message sent by a person names an untitled session, as `send` (and the REST transport) does
            return await self.brain.run_turn(session_id, text, name_untitled=True, attachments=attached)

    async def resume_turn(self, session_id: str, watch: Watch) -> str | None:
        # through the host: a plugin may resume its kind of session as a whole (a dream)
        await self.ready()
        with self._hearing(session_id, watch):
            return await self.host.resume(session_id)

    @contextlib.contextmanager
    def _hearing(self, session_id: str, watch: Watch) -> Iterator[None]:
        """`watch` hears the session's events, deltas and live output on this loop while the block runs."""
        loop = asyncio.get_running_loop()

        def on_event(e: Event) -> None:  # on the log's writer thread, after the commit
            if e.session_id == session_id and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed in between
                    loop.call_soon_threadsafe(watch, Message("event", session_id, event=e))

        stops = [self.log.subscribe(on_event), *self._listen(session_id, watch)]
        try:
            yield
        finally:
            for stop in stops:
                stop()

    def _listen(self, session_id: str, hear: Callable[[Message], None]) -> list[Callable[[], None]]:
        """Hear the session's live deltas and output (both come on the loop); the functions that stop it."""

        def on_delta(sid: str, ev: dict[str, Any]) -> None:
            if sid == session_id:
                hear(Message("delta", sid, data=ev))

        def on_output(sid: str, m: dict[str, Any]) -> None:
            if sid == session_id:
                hear(Message("output", sid, data=m))

        return [self.brain.listen(on_delta), self.brain.listen_output(on_output)]

    @contextlib.asynccontextmanager
    async def stream(self, session_id: str, after: int = 0,
                     timeout: float | None = None) -> AsyncIterator[AsyncIterator[Message]]:
        """Heard first and queued, then the backlog read; the queue skips what the backlog had (no gap, no
        duplicate); then each running call's output so far, and later output of that call only after it."""
        await self.session(session_id)  # UnknownSession first
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Message] = asyncio.Queue()

        def put(messages: list[Message]) -> None:
            for m in messages:
                queue.put_nowait(m)

        def on_commit(events: list[Event]) -> None:  # on the writer thread: one hop per commit
            mine = [Message("event", session_id, event=e) for e in events if e.session_id == session_id]
            if mine and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(put, mine)

        stops = [self.log.subscribe_commits(on_commit), *self._listen(session_id, queue.put_nowait)]
        try:
            backlog = await asyncio.to_thread(self.log.events, session_id, after)
            yield self._messages(session_id, after, backlog, queue, timeout)
        finally:
            for stop in stops:
                stop()

    async def _messages(self, session_id: str, after: int, backlog: list[Event], queue: asyncio.Queue[Message],
                        timeout: float | None) -> AsyncIterator[Message]:
        last = after
        for e in backlog:
            last = e.seq
            yield Message("event", session_id, event=e)
        snapshots = self.brain.live.snapshots(session_id)
        sent = {m["tool_use_id"]: m["n"] for m in snapshots}
        for m in snapshots:
            yield Message("output", session_id, data=m)
        while True:
            msg = await asyncio.wait_for(queue.get(), timeout)
            if msg.kind == "event":
                assert msg.event is not None, "an event message carries its event"
                if msg.event.seq <= last:
                    continue
                last = msg.event.seq
            elif msg.kind == "output" and msg.data is not None and msg.data["n"] <= sent.get(msg.data["tool_use_id"], 0):
                continue
            yield msg

    # -- hands and the workspace ---------------------------------------------------------------

    async def hands(self, session_id: str) -> dict[str, Any]:
        await self.ready()
        hands = await self.brain.hands(session_id)
        return {**hands.status(), "session_id": session_id, "running": self.turns.running(session_id)}

    async def restart_hands(self, session_id: str) -> dict[str, Any]:
        await self.ready()
        hands = await self.brain.hands(session_id)
        if await self._call_in_flight(session_id):
            # A call is running (or its kernel is starting for it): kill the kernel once it has one, so the
            # call ends the way a kernel death does (an error result for the model) and the next call starts fresh.
            status = await self._kernel_of_call(session_id, hands)
            if status.get("pid"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(status["pid"]), signal.SIGKILL)
                generation = (status.get("generation") or 0) + 1
                await self.log.aappend(session_id, "hands_restarted", {"generation": generation, "by": "api", "killed_busy": True})
                return await self.hands(session_id)
        await hands.restart()
        await self.log.aappend(session_id, "hands_restarted", {"generation": hands.status().get("generation"), "by": "api"})
        return await self.hands(session_id)

    async def close_hands(self, session_id: str) -> dict[str, Any]:
        """A running call is interrupted and answered first (see KernelHands.close)."""
        await self.ready()
        hands = await self.brain.hands(session_id)
        closed = await hands.close("api")
        return {**await self.hands(session_id), "closed": closed}

    async def _call_in_flight(self, session_id: str) -> bool:
        if not self.turns.running(session_id):
            return False
        st = await self.brain.turn_state(session_id)
        return bool(st.started - st.answered)

    async def _kernel_of_call(self, session_id: str, hands: Hands, wait: float = 60.0) -> dict[str, Any]:
        """The hands' status once the running call's kernel runs it (busy, with a pid); {} if the call ended first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while loop.time() < deadline and await self._call_in_flight(session_id):
            status = hands.status()
            if status.get("state") == "busy" and status.get("pid"):
                return status
            await asyncio.sleep(0.05)
        return {}

    async def _workspace(self, session_id: str, create: bool) -> tuple[Any, Path | None]:
        """(the session's hands, its workspace directory or None); UnknownSession, NoWorkspace."""
        await self.session(session_id)  # 404 first
        await self.ready()
        hands = await self.brain.hands(session_id)
        return hands, await hands.workspace(create)

    async def files(self, session_id: str) -> dict[str, Any]:
        _, root = await self._workspace(session_id, create=False)
        if root is None or not root.is_dir():
            return {"files": [], "truncated": False, "workspace": False}
        files, cut = await asyncio.to_thread(wsfiles.list_files, root, self.files_settings.max_list)
        return {"files": files, "truncated": cut, "workspace": True}

    async def put_file(self, session_id: str, path: str, data: bytes | BinaryIO, *, name: str = "",
                       kind: str = "file") -> dict[str, Any]:
        """Written into the workspace (made if the session has none yet), then recorded as `file_attached`."""
        import io

        path = wsfiles.check_path(path)
        source = io.BytesIO(data) if isinstance(data, bytes) else data
        hands, root = await self._workspace(session_id, create=True)
        assert root is not None, "a workspace is made when asked to create one"
        written = await asyncio.to_thread(wsfiles.write_file, root, path, source, hands.workspace_owner())
        payload = {"name": name or path.rsplit("/", 1)[-1], "path": written["path"], "bytes": written["bytes"],
                   "sha256": written["sha256"], "kind": kind or "file"}
        event = await self.log.aappend(session_id, "file_attached", payload)
        return {**payload, "seq": event.seq}

    async def file_root(self, session_id: str, path: str) -> Path:
        """The workspace directory holding `path` (checked); NoSuchFile when the session has none yet."""
        wsfiles.check_path(path)
        _, root = await self._workspace(session_id, create=False)
        if root is None or not root.is_dir():
            raise wsfiles.NoSuchFile(f"session {session_id} has no workspace yet (it ran no code and was sent no file)")
        return root

    def download_limit(self) -> int:
        """The most bytes a file of a workspace may be to be read out of it (setting max_download_mb)."""
        return int(self.files_settings.max_download_mb) << 20

    async def read_file(self, session_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        root = await self.file_root(session_id, path)

        def read() -> bytes:
            with wsfiles.open_file(root, wsfiles.check_path(path), self.download_limit()) as (fh, size):
                if max_bytes is not None and size > max_bytes:
                    raise wsfiles.FileTooLarge(f"{path!r} is {size:,} bytes, more than max_bytes={max_bytes:,}")
                return fh.read()

        return await asyncio.to_thread(read)

    # -- plugins and the server's start ----------------------------------------------------------

    def part(self, name: str, kind: type[T]) -> T:
        made = self._parts.get(name)
        if made is None:
            plugin = next((p for p in self.host.plugins if p.name == name), None)
            part = plugin.service() if plugin is not None else None
            if plugin is None or part is None:
                raise no_part(name, [p.name for p in self.host.plugins])
            made = self._parts[name] = part.local(plugin)
        return checked(name, made, kind)

    async def wake(self) -> list[str]:
        """Resume, in the background, every session whose turn was cut off (a dead server): what the plugins go
        on with themselves first (a dream's remaining chunks), then every other cut-off turn."""
        await self.ready()
        rows = await asyncio.to_thread(self.log.sessions)
        resumed = []
        for p in self.host.plugins:
            resumed += await p.wake()
        taken = set(resumed)
        for s in rows:
            # a session a plugin went on with is its; any other cut-off turn the brain finishes, also one of a
            # kind a plugin resumes (a chat turn sent to a dream that had ended is an ordinary turn)
            if s["state"] != "unfinished" or self.turns.at_work(s["id"]) or s["id"] in taken:
                continue
            try:
                await asyncio.to_thread(self.host.models.check, s["model"])
                if await self.brain.start_resume(s["id"]):
                    resumed.append(s["id"])
            except WorkbenchError as e:  # e.g. the key is gone: leave the turn for a later resume
                self.logger.warning("workbench: cannot resume session %s: %s", s["id"], e)
        return resumed


__all__ = ["Local"]
