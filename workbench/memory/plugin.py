"""Memory and dreaming as a plugin: the first built-in one, on the same surface a third party uses.

It contributes the memory store (in the session log's DuckDB file), the dream
tools and the `scripted:dream` script, the accepted memories in new sessions'
system prompts, the memory and dream routes, the `dream`, `memories`,
`memory` and `review` commands, and at start-up: committing dreams that
ended while nobody committed them, and the dream scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import from_env
from ..errors import ConfigError, TurnBusy
from ..log import DuckDBLog, Event
from ..plugins import Command, NewSession, Plugin, PromptPart
from .dream import DEFAULT_INSTRUCTIONS, DreamScheduler, commit_dream, commit_finished_dreams, create_dream, run_dream
from .dream_script import dream_script
from .store import MemorySettings, MemoryStore
from .tools import dream_tools

if TYPE_CHECKING:  # the host imports its plugins
    from ..host import Host


@dataclass
class MemoryPlugin(Plugin):
    """Memories, dreams and their review."""

    name: str = "memory"
    settings: MemorySettings = field(default_factory=lambda: from_env(MemorySettings, prefix="WORKBENCH_MEMORY_"))
    store: MemoryStore | None = field(default=None, repr=False)
    scheduler: DreamScheduler | None = field(default=None, repr=False)
    _unsubscribe: Any = field(default=None, repr=False)
    _dreaming: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    # -- without a host --------------------------------------------------------------

    def settings_classes(self) -> Sequence[type]:
        return (MemorySettings,)

    def commands(self) -> Sequence[Command]:
        from .cli import COMMANDS

        return COMMANDS

    def routes(self) -> Sequence[tuple[str, type]]:
        from .routes import ROUTES

        return ROUTES

    # -- bound to a host -------------------------------------------------------------

    def attach(self, host: Host) -> None:
        super().attach(host)
        # the store's tables live in the log's own DuckDB file; a log without SQL (the in-memory
        # twin of fast tests) has no memory, and sessions simply get none
        self.store = MemoryStore(host.log, self.settings) if isinstance(host.log, DuckDBLog) else None

    def tools(self) -> Sequence[Any]:
        return dream_tools(self.store) if self.store is not None else ()

    def scripts(self) -> Mapping[str, Any]:
        return {"dream": dream_script}

    def system_prompt(self, session: NewSession) -> PromptPart | None:
        """Accepted memories join the frozen prompt of a new (non-dream) session, recorded with it."""
        if self.store is None or session.kind == "dream":
            return None
        text, injected = self.store.prompt_memories()
        if not injected:
            return None
        return PromptPart(text, (("memories_injected", {"memories": injected, "text": text}),))

    async def startup(self) -> None:
        if self.store is None or self.store.log.read_only:
            return
        host, loop = self._host(), asyncio.get_running_loop()
        # a dream whose turn ended just before its process stopped is committed now (idempotent)
        await asyncio.to_thread(commit_finished_dreams, self.store)

        def on_commit(e: Event) -> None:  # on the log's writer thread: never wait for a write here
            if e.type == "turn_ended" and e.payload.get("stop_reason") == "end_turn" and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed in between
                    loop.call_soon_threadsafe(lambda: host.background(asyncio.to_thread(self._commit_if_dream, e.session_id)))

        self._unsubscribe = self.store.log.subscribe(on_commit)
        if self.settings.dream_every > 0:
            self.scheduler = DreamScheduler(lambda batch: self.start_dream(sessions=batch), self.store, loop, host.background)

    async def shutdown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        if self._unsubscribe is not None:
            self._unsubscribe()

    def _commit_if_dream(self, session_id: str) -> None:
        if self.store is not None and self.store.log.session(session_id)["kind"] == "dream":
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
        """The model a dream uses: the one asked for, else `dream_model`, else the host's default."""
        return model or self.settings.dream_model or self._host().models.default_name()

    async def running_dream(self) -> str | None:
        """The id of a dream whose turn runs in this host, if any."""
        running = self._host().brain.turns.sessions()
        if not running:
            return None
        rows = await asyncio.to_thread(self.require_store().log.sessions, ids=running)
        return next((s["id"] for s in rows if s["kind"] == "dream"), None)

    async def create_dream(self, sessions: list[str] | None = None, model: str | None = None) -> str:
        """Create a dream session (checked: its sessions exist and are chats, its model can be made)."""
        store, brain = self.require_store(), self._host().brain
        model = self.dream_model(model)
        await asyncio.to_thread(self._host().models.check, model)
        return await asyncio.to_thread(lambda: create_dream(brain, store, sessions=sessions, model=model))

    async def start_dream(self, sessions: list[str] | None = None, model: str | None = None,
                          instructions: str | None = None) -> str:
        """Start a dream in the background (one at a time); it is committed when its turn ends."""
        async with self._dreaming:  # two requests at once must not both pass the check below
            running = await self.running_dream()
            if running:
                # two dreams over the same sessions would each propose the same facts
                raise TurnBusy(f"dream {running} is still running; wait for it (GET /workbench/api/dreams/{running})")
            dream_id = await self.create_dream(sessions, model)
            await self._host().brain.start_turn(dream_id, instructions or DEFAULT_INSTRUCTIONS)
            return dream_id

    async def run_dream(self, dream_id: str, instructions: str | None = None) -> dict[str, Any]:
        """Run a created dream to its end and commit it; the commit summary with the stop reason."""
        return await run_dream(self._host().brain, self.require_store(), dream_id, instructions)
