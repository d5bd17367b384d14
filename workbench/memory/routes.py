"""The memory and dream routes of the API (docs/api.md, "Memory and dreams"), served by the memory plugin.

The store lives in the server process, next to the log it shares; handlers
call it off the event loop. A dream runs as an ordinary turn of the brain,
so it can be watched and interrupted through the session routes, and never
delays a user's turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tornado import web

from ..errors import ConfigError
from ..server.handlers import WorkbenchHandler, api
from ..server.routes import API


class MemoryHandlerBase(WorkbenchHandler):
    @property
    def plugin(self) -> Any:
        """This server's memory plugin (MemoryPlugin)."""
        return self.runtime.host.plugin("memory")

    @property
    def store(self) -> Any:
        return self.plugin.require_store()

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
    @api
    async def get(self) -> None:
        q = {k: self.get_query_argument(k, None) for k in ("status", "tag", "dream", "search")}
        self.reply({"memories": await asyncio.to_thread(lambda: self.store.list(**q))})


class MemoryHandler(MemoryHandlerBase):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await asyncio.to_thread(self.store.get, id))

    @web.authenticated
    @api
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
    @api
    async def get(self) -> None:
        self.reply({"dreams": await asyncio.to_thread(self.store.dreams)})

    @web.authenticated
    @api
    async def post(self) -> None:
        body = self.dict_body()
        unknown = set(body) - {"sessions", "model", "instructions"}
        if unknown:
            raise ConfigError(f"unknown fields: {', '.join(sorted(unknown))}; a dream takes sessions, model, instructions")
        sessions = body.get("sessions")
        if sessions is not None and not (isinstance(sessions, list) and all(isinstance(s, str) for s in sessions)):
            raise ConfigError('"sessions" must be a list of session ids')
        for key in ("model", "instructions"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise ConfigError(f'"{key}" must be a string')
        dream_id = await self.plugin.start_dream(sessions, body.get("model"), body.get("instructions"))
        self.reply({"dream_id": dream_id, "state": "running"}, 202)


class DreamHandler(MemoryHandlerBase):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        from ..memory.dream import dream_status

        status = await asyncio.to_thread(dream_status, self.store, id)
        if self.runtime.brain.running(id):
            status["state"] = "running"
        self.reply(status)


ROUTES: tuple[tuple[str, type], ...] = (
    (f"{API}/memories", MemoriesHandler),
    (f"{API}/memories/{{id}}", MemoryHandler),
    (f"{API}/dreams", DreamsHandler),
    (f"{API}/dreams/{{id}}", DreamHandler),
)
