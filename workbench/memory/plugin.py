"""Memory and dreaming as a plugin: the first built-in one, on the same surface a third party uses.

It contributes the memory store (in the session log's DuckDB file), the dream
tools, `recall`, the memory tool (`memory`: Anthropic's, over the stores a session mounts) and the
`scripted:dream` script, the accepted memories in new sessions'
system prompts, the memory and dream routes, the `dream`, `memories`,
`memory` and `review` commands, and at start-up: committing dream chunks that
ended while nobody committed them, and the dream scheduler. It resumes dreams
as a whole (`resumers`), and a server start goes on with cut-off ones (`wake`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..plugins import Command, NewSession, Plugin, PromptPart
from ..plugins.errors import ConfigError, TurnBusy, UnknownSession, WorkbenchError
from ..plugins.log import Event
from ..plugins.settings import EgressSettings, Vault, from_env
from .dream import (
    DreamScheduler,
    cancel_dream,
    commit_dream,
    commit_finished_dreams,
    create_dream,
    drive_dream,
    has_unread,
    unfinished_dreams,
)
from .dream_script import dream_script
from .memtool import memory_tool
from .mounts import check_memory_config, session_mounts, stores_of
from .secretscan import SecretScanner
from .shared import SharedStores, parse_shared
from .store import MemorySettings, MemoryStore, check_store
from .tools import dream_tools, recall_tool

log_ = logging.getLogger(__name__)

if TYPE_CHECKING:  # the host imports its plugins
    from ..plugins import PluginHost as Host


@dataclass
class MemoryPlugin(Plugin):
    """Memories, dreams and their review."""

    name: str = "memory"
    settings: MemorySettings = field(default_factory=lambda: from_env(MemorySettings, prefix="WORKBENCH_MEMORY_"))
    store: MemoryStore | None = field(default=None, repr=False)
    scheduler: DreamScheduler | None = field(default=None, repr=False)
    vault: Vault | None = field(default=None, repr=False)  # whose values no memory may hold (default: the host's)
    _unsubscribe: Any = field(default=None, repr=False)
    _dreaming: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _stopping: bool = field(default=False, repr=False)
    _timer: asyncio.Future | None = field(default=None, repr=False)
    _driving: dict[str, asyncio.Future] = field(default_factory=dict, repr=False)  # dreams this host runs, by id
    shared: SharedStores | None = field(default=None, repr=False)  # stores mounted read-only from files (shared.py)

    # -- without a host --------------------------------------------------------------

    def settings_classes(self) -> Sequence[type]:
        return (MemorySettings,)

    def commands(self) -> Sequence[Command]:
        from .cli import COMMANDS

        return COMMANDS

    def config_checks(self) -> Mapping[str, Callable[[Any], None]]:
        return {"memory": check_memory_config}  # the stores a session mounts (docs/memory.md, "Stores")

    def client(self) -> Mapping[str, Any]:
        from .client import METHODS

        return METHODS

    def routes(self) -> Sequence[tuple[str, type]]:
        from .routes import ROUTES

        return ROUTES

    # -- bound to a host -------------------------------------------------------------

    def attach(self, host: Host) -> None:
        super().attach(host)
        self.settings.check_tool_accept_stores()
        # the store's tables live in the log's own DuckDB file; a log without SQL (the in-memory
        # twin of fast tests) has no memory, and sessions simply get none
        sql = host.log.sql()
        if sql is not None:
            # the egress vault the hands use (or WORKBENCH_VAULT's when this host has no sandbox)
            hands_vault = host.hands.vault if host.hands is not None else None
            vault = self.vault or hands_vault or Vault.load(from_env(EgressSettings).vault)
            self.store = MemoryStore(sql, self.settings, SecretScanner(vault.redact))
            shared = parse_shared(self.settings.shared_stores)  # ConfigError: the host does not start
            if shared and not sql.read_only:  # a read-only command reads the mirror the server last made
                self.shared = SharedStores(self.store, shared, self.settings.shared_maintainer)
        else:
            self.store = None

    def scripts(self) -> Mapping[str, Any]:
        return {"dream": dream_script}

    def tools(self) -> Sequence[Any]:
        if self.store is None:
            return ()
        return (*dream_tools(self.store), recall_tool(self.store), memory_tool(self.store))

    def event_types(self) -> Mapping[str, str]:
        return {
            "dream_chunk": "a dream planned its next chunk: the ranges of unread events its next turn reads",
            "dream_ended": "a dream read everything in its scope: its chunks and proposals",
            "dream_cancelled": "a dream was cancelled: no later chunk runs and no resume goes on with it",
        }

    def resumers(self) -> Mapping[str, Any]:
        """A dream resumes as a whole: its cut-off chunk, then the chunks still to read."""
        return {"dream": self.drive}

    async def wake(self) -> list[str]:
        """A server start goes on, in the background, with every dream that was cut off (mid-chunk or between)."""
        if self.store is None or self.store.log.read_only:
            return []
        ids = await asyncio.to_thread(unfinished_dreams, self.store)
        for d in ids:
            self._host().background(self._quietly(self._driver(d)))
        return ids

    async def _quietly(self, driver: asyncio.Future) -> None:
        try:
            await asyncio.shield(driver)
        except WorkbenchError as e:  # e.g. the dream's model cannot be made here (no key): a later resume goes on
            log_.warning("workbench: a dream did not run to its end: %s", e)

    def system_prompt(self, session: NewSession) -> PromptPart | None:
        """Accepted memories of the stores it mounts join the frozen prompt of a new (non-dream) session, recorded
        with it: ranked by relevance to its first message (else its title), then newest, within `inject_chars`."""
        if self.store is None or session.kind == "dream":
            return None
        if self.shared is not None:
            self.shared.refresh()  # a file its maintainer published since: this session is told what it holds now
        mounts = session_mounts(session.config, session.kind, self.store.shared)  # ConfigError: the session is not created
        query, by = (session.message, "message") if session.message else (session.title, "title") if session.title else (None, "recency")
        text, injected, left_out, held = self.store.injection(query, stores_of(mounts))
        if not injected:
            return None
        return PromptPart(text, (("memories_injected", {"memories": injected, "text": text, "ranked_by": by,
                                                        "left_out": left_out, "held_back": held,
                                                        "stores": [m.to_json() for m in mounts]}),))

    async def startup(self) -> None:
        if self.store is None or self.store.log.read_only:
            return
        host, loop = self._host(), asyncio.get_running_loop()
        # a dream whose turn ended just before its process stopped is committed now (idempotent)
        await asyncio.to_thread(commit_finished_dreams, self.store)
        if self.shared is not None:
            await asyncio.to_thread(self.shared.refresh)

        def on_commit(e: Event) -> None:  # on the log's writer thread: never wait for a write here
            if e.type == "turn_ended" and e.payload.get("stop_reason") == "end_turn" and self._is_dream(e.session_id) \
                    and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed in between
                    loop.call_soon_threadsafe(lambda: host.background(asyncio.to_thread(self._commit_if_dream, e.session_id)))

        self._unsubscribe = self.store.log.subscribe(on_commit)
        if self.settings.dream_every > 0:
            self.scheduler = DreamScheduler(lambda batch: self.start_dream(sessions=batch), self.store, loop, host.background)
        if self.settings.dream_interval > 0:
            self._timer = asyncio.ensure_future(self._every(self.settings.dream_interval))

    async def shutdown(self) -> None:
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
        if self.scheduler is not None:
            self.scheduler.close()
        if self._unsubscribe is not None:
            self._unsubscribe()

    async def _every(self, seconds: float) -> None:
        """Every `dream_interval` seconds, a dream over what is unread (none while one runs or nothing is new)."""
        while not self._stopping:
            await asyncio.sleep(seconds)
            try:
                if not self._stopping and await self.running_dream() is None \
                        and await asyncio.to_thread(has_unread, self.require_store()):
                    await self.start_dream()
            except WorkbenchError as e:  # e.g. the dream model cannot be made: the next tick tries again
                log_.warning("workbench: the scheduled dream did not start: %s", e)

    def _is_dream(self, session_id: str) -> bool:
        """Whether the session is a dream: its kind, known to the log after the first read (a chat's turn costs no query)."""
        try:
            return self.store is not None and self.store.log.session_kind(session_id) == "dream"
        except UnknownSession:  # deleted since
            return False

    def _commit_if_dream(self, session_id: str) -> None:
        if self.store is not None and self._is_dream(session_id):
            commit_dream(self.store, session_id)

    def _host(self) -> Host:
        assert self.host is not None, "the host attaches its plugins before it starts them or serves their routes"
        return self.host

    # -- what the routes and commands use ---------------------------------------------------

    def require_store(self) -> MemoryStore:
        """The store; ConfigError when this host's log cannot hold one."""
        if self.store is None:
            raise ConfigError("this host's log has no memory store (memory needs the DuckDB session log)")
        return self.store

    def dream_model(self, model: str | None) -> str:
        """The model a dream uses: the one asked for, else `dream_model`, else the host's default; on a host whose
        default is the offline `scripted` model (no key), the offline demo dreamer `scripted:dream`.

        Never the plain scripted model when asked for: it echoes what it is told and can read nothing, so a dream
        of it would only ever say "read nothing new". ConfigError says what to pass instead."""
        chosen = model or self.settings.dream_model
        if not chosen:
            default = self._host().models.default_name()
            # offline (as the README's `workbench dream` runs on a fresh machine): the rule-based dreamer
            return "scripted:dream" if default == "scripted" else default
        if chosen == "scripted":
            raise ConfigError(
                "dreams need a model that reads sessions: pass --model claude-opus-5-5 (with ANTHROPIC_API_KEY set) "
                "or set WORKBENCH_MEMORY_DREAM_MODEL; --model scripted:dream is the offline demo dreamer")
        return chosen

    async def running_dream(self) -> str | None:
        """The id of a dream whose turn runs in this host, if any."""
        running = [*self._host().brain.running_sessions(), *self._driving]
        if not running:
            return None
        rows = await asyncio.to_thread(self.require_store().log.sessions, ids=running)
        return next((s["id"] for s in rows if s["kind"] == "dream"), None)

    async def create_dream(self, sessions: list[str] | None = None, model: str | None = None,
                           instructions: str | None = None, store: str | None = None) -> str:
        """Create a dream session that proposes into `store` (default: `dream_store`), checked: its sessions
        exist and are chats, its store's name is valid, its model can be made."""
        memories, brain = self.require_store(), self._host().brain
        target = check_store(store or self.settings.dream_store)  # before anything is created
        model = self.dream_model(model)
        await asyncio.to_thread(self._host().models.check, model)
        return await asyncio.to_thread(lambda: create_dream(brain, memories, sessions=sessions, model=model,
                                                            instructions=instructions, target=target))

    async def start_dream(self, sessions: list[str] | None = None, model: str | None = None,
                          instructions: str | None = None, store: str | None = None) -> str:
        """Start a dream in the background (one at a time); each chunk is committed when its turn ends."""
        async with self._dreaming:  # two requests at once must not both pass the check below
            running = await self.running_dream()
            if running:
                # two dreams over the same sessions would each propose the same facts
                raise TurnBusy(f"dream {running} is still running; wait for it (GET /workbench/api/dreams/{running})")
            dream_id = await self.create_dream(sessions, model, instructions, store)
            self._host().background(self._quietly(self._driver(dream_id)))  # registered now: a second start sees it
            return dream_id

    def _driver(self, dream_id: str, instructions: str | None = None) -> asyncio.Future:
        """The task that drives the dream in this host: the one running, else a new one (one driver per dream)."""
        task = self._driving.get(dream_id)
        if task is None:
            task = self._driving[dream_id] = asyncio.ensure_future(self._drive(dream_id, instructions))
            task.add_done_callback(lambda _: self._driving.pop(dream_id, None))
        return task

    async def _drive(self, dream_id: str, instructions: str | None) -> dict[str, Any]:
        store = self.require_store()
        await asyncio.to_thread(self._host().models.check, (await store.log.asession(dream_id))["model"])
        return await drive_dream(self._host().brain, store, dream_id, instructions, stopping=lambda: self._stopping)

    async def drive(self, dream_id: str, instructions: str | None = None) -> dict[str, Any]:
        """Run a dream, or go on with one cut off anywhere, to its end; its summary with the stop reason."""
        store = self.require_store()
        if (await store.log.asession(dream_id))["kind"] != "dream":
            raise ConfigError(f"session {dream_id} is not a dream")
        return await asyncio.shield(self._driver(dream_id, instructions))

    def driving(self, dream_id: str) -> bool:
        """Whether this host runs the dream now (a chunk's turn, or between chunks)."""
        return dream_id in self._driving or self._host().brain.running(dream_id)

    async def cancel(self, dream_id: str, actor: str) -> bool:
        """Cancel a dream: recorded first (no later chunk, no resume), then its running chunk is interrupted."""
        cancelled = await asyncio.to_thread(cancel_dream, self.require_store(), dream_id, actor)
        await self._host().brain.interrupt(dream_id, by=actor)
        return cancelled

    async def run_dream(self, dream_id: str, instructions: str | None = None) -> dict[str, Any]:
        """Run a created dream to its end, chunk by chunk, each committed; the summary with the stop reason."""
        return await self.drive(dream_id, instructions)
