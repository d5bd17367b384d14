"""The memory and dream routes of the API (docs/api.md, "Memory and dreams").

The store lives in the server process (brain.extras["memory"], next to the
log it shares); handlers call it off the event loop. A dream runs as a
background turn of the server, like any session's turn, so it can be watched
and interrupted through the session routes, and never delays a user's turn.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable

from tornado import web

from ..errors import ConfigError, DatabaseLocked, MemoryConflict, TurnBusy, UnknownMemory, WorkbenchError
from .handlers import WorkbenchHandler, status_of
from .routes import API

MEMORY_STATUS = {UnknownMemory: 404, MemoryConflict: 409}


def memory_api(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
    """Workbench errors as a 4xx with a JSON error body (404 unknown memory, 409 conflict)."""

    @functools.wraps(fn)
    async def wrapper(self: "MemoryHandlerBase", *args: Any, **kwargs: Any) -> None:
        try:
            await fn(self, *args, **kwargs)
        except WorkbenchError as e:
            status = next((s for cls, s in MEMORY_STATUS.items() if isinstance(e, cls)), None)
            self.set_status(status or status_of(e))
            self.finish({"error": str(e)})

    return wrapper


class MemoryHandlerBase(WorkbenchHandler):
    @property
    def store(self) -> Any:
        store = self.runtime.brain.extras.get("memory")
        if store is None:
            raise DatabaseLocked("the memory store is not attached to this server's brain (workbench.memory.attach)")
        return store

    def actor(self, body: dict[str, Any]) -> str:
        """Who acts: the body's actor, else the authenticated Jupyter user as person:<name>."""
        if body.get("actor"):
            return body["actor"]
        user = self.current_user
        name = getattr(user, "username", None) or getattr(user, "name", None) or "jupyter"
        return f"person:{name}"

    def dict_body(self) -> dict[str, Any]:
        body = self.body()
        if not isinstance(body, dict):
            raise ConfigError("the body must be a JSON object")
        return body


class MemoriesHandler(MemoryHandlerBase):
    @web.authenticated
    @memory_api
    async def get(self) -> None:
        q = {k: self.get_query_argument(k, None) for k in ("status", "tag", "dream", "search")}
        self.reply({"memories": await asyncio.to_thread(lambda: self.store.list(**q))})


class MemoryHandler(MemoryHandlerBase):
    @web.authenticated
    @memory_api
    async def get(self, id: str) -> None:
        self.reply(await asyncio.to_thread(self.store.get, id))

    @web.authenticated
    @memory_api
    async def patch(self, id: str) -> None:
        body = self.dict_body()
        action = body.get("action")
        if not isinstance(action, str):
            raise ConfigError('the body needs "action": accept, reject, edit, merge, retire or redact')
        actor = self.actor(body)
        kw = {k: v for k, v in body.items() if k not in ("action", "actor")}
        self.reply(await asyncio.to_thread(lambda: self.store.review(id, action, actor, **kw)))


class DreamsHandler(MemoryHandlerBase):
    @web.authenticated
    @memory_api
    async def get(self) -> None:
        self.reply({"dreams": await asyncio.to_thread(self.store.dreams)})

    @web.authenticated
    @memory_api
    async def post(self) -> None:
        from ..brain.models import check_model_name
        from ..memory.dream import create_dream, run_dream

        body = self.dict_body()
        unknown = set(body) - {"sessions", "model", "instructions"}
        if unknown:
            raise ConfigError(f"unknown fields: {', '.join(sorted(unknown))}; a dream takes sessions, model, instructions")
        sessions = body.get("sessions")
        if sessions is not None and not (isinstance(sessions, list) and all(isinstance(s, str) for s in sessions)):
            raise ConfigError('"sessions" must be a list of session ids')
        model = body.get("model") or self.store.settings.dream_model or self.runtime.default_model_name()
        check_model_name(model)
        busy = [sid for sid in list(self.runtime.tasks) if self.runtime.running(sid)]
        rows = await asyncio.to_thread(self.runtime.log.sessions, ids=busy) if busy else []  # off the event loop
        running = [s["id"] for s in rows if s["kind"] == "dream"]
        if running:
            # one dream at a time: two dreams over the same sessions would each propose the same facts
            raise TurnBusy(f"dream {running[0]} is still running; wait for it (GET {API}/dreams/{running[0]})")
        brain = self.runtime.brain
        dream_id = await asyncio.to_thread(lambda: create_dream(brain, sessions=sessions, model=model))
        self.runtime._start(dream_id, run_dream(brain, dream_id=dream_id, instructions=body.get("instructions")))
        self.reply({"dream_id": dream_id, "state": "running"}, 202)


class DreamHandler(MemoryHandlerBase):
    @web.authenticated
    @memory_api
    async def get(self, id: str) -> None:
        from ..memory.dream import dream_status

        status = await asyncio.to_thread(dream_status, self.store, id)
        if self.runtime.running(id):
            status["state"] = "running"
        self.reply(status)


def setup(runtime: Any) -> None:
    """Called by the extension once the log and brain exist: attach the store, and start dreaming after N sessions if set."""
    from ..memory import attach

    store = attach(runtime.brain)
    from ..memory.dream import commit_finished_dreams

    # a dream whose turn ended just before the server stopped, or that the server resumed
    # after a crash, is committed here (commit_dream is idempotent, run_dream commits too)
    commit_finished_dreams(store)

    def on_commit(e: Any) -> None:
        loop = runtime._loop
        if e.type == "turn_ended" and e.payload.get("stop_reason") == "end_turn" and loop is not None and not loop.is_closed():
            # on the writer thread: never wait for a write here; commit from the loop, off-thread
            # a tracked side job, so the server waits for it before it closes the log
            loop.call_soon_threadsafe(lambda: runtime.background(asyncio.to_thread(_commit_if_dream, store, e.session_id)))

    store.log.subscribe(on_commit)
    if store.settings.dream_every > 0:
        from ..memory.dream import DreamScheduler

        # the runtime learns its event loop when the server starts; the scheduler asks for it then
        runtime.dream_scheduler = DreamScheduler(runtime.brain, loop=lambda: runtime._loop)


def _commit_if_dream(store: Any, session_id: str) -> None:
    from ..memory.dream import commit_dream

    if store.log.session(session_id)["kind"] == "dream":
        commit_dream(store, session_id)


HANDLERS: list[tuple[str, type]] = [
    (f"{API}/memories", MemoriesHandler),
    (f"{API}/memories/{{id}}", MemoryHandler),
    (f"{API}/dreams", DreamsHandler),
    (f"{API}/dreams/{{id}}", DreamHandler),
]
