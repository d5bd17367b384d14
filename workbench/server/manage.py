"""Handlers of the routes that manage sessions: rename and archive, delete, fork, search, usage, and the models
a session may be created with (docs/api.md, "Managing sessions")."""

from __future__ import annotations

from tornado import web

from . import bodies
from .handlers import WorkbenchHandler, api


class SessionHandler(WorkbenchHandler):
    """`PATCH /sessions/{id}` (rename, archive) and `DELETE /sessions/{id}`; GET is the plain session's."""

    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await self.service.session(id))

    @web.authenticated
    @api
    async def patch(self, id: str) -> None:
        title, archived = bodies.patch_body(self.body())
        row = await self.service.rename(id, title) if title is not None else None
        if archived is not None:
            row = await self.service.archive(id, archived)
        self.reply(row)  # the session's row after both (patch_body refuses a body with neither)

    @web.authenticated
    @api
    async def delete(self, id: str) -> None:
        bodies.empty_body(self.body())
        self.reply(await self.service.delete(id))


class ForkHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        b = bodies.fork_body(self.body())
        self.reply(await self.service.fork(id, b.seq, new_id=b.id, title=b.title), 201)


class UsageHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await self.service.usage(id))


class SearchHandler(WorkbenchHandler):
    args = bodies.SearchArgs

    @web.authenticated
    @api
    async def get(self) -> None:
        q = self.query
        kw = {"limit": q.limit or 20, "cursor": q.cursor, "kind": q.kind, "archived": bodies.flag(q.archived)}
        self.reply(await self.service.search(q.q, **kw))


class ModelsHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self) -> None:
        self.reply(await self.service.models())
