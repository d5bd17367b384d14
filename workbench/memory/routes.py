"""The memory and dream routes of the API (docs/api.md, "Memory and dreams"), served by the memory plugin.

The store lives in the server process, next to the log it shares; handlers
call it off the event loop. A dream runs as an ordinary turn of the brain,
so it can be watched and interrupted through the session routes, and never
delays a user's turn. Bodies and query arguments are checked with the
core's strict shapes (workbench.plugins.web: the server's own) before the
store sees them: each review action takes exactly its own fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field
from tornado import web

from ..plugins.errors import BodyTooLarge, ConfigError, UnknownMemory, UnknownSession, WorkbenchError
from ..plugins.web import (
    API,
    MAX_ID_CHARS,
    MAX_MODEL_CHARS,
    Body,
    Digits,
    EmptyBody,
    Flag,
    Handler,
    Items,
    Text,
    api,
    check_model,
    flag,
    kind_of,
    parse,
    within,
)
from . import store as memory_store, tools as memory_tools, transfer as memory_transfer
from .store import REVIEW_ACTIONS, STATUSES, person

# limits of what a person or a client may write into a memory (docs/api.md, "Limits")
MAX_MEMORY_TITLE_CHARS = memory_store.MAX_TITLE_CHARS
MAX_MEMORY_TEXT_CHARS = memory_store.MAX_TEXT_CHARS
MAX_TAGS = memory_store.MAX_TAGS
MAX_TAG_CHARS = memory_store.MAX_TAG_CHARS
MAX_NOTE_CHARS = memory_store.MAX_NOTE_CHARS
MAX_MERGE = 20
MAX_INSTRUCTIONS_CHARS = 100_000
MAX_DREAM_SESSIONS = 1000  # the dream_max_sessions setting (default 20) applies as well
MAX_SEARCH_CHARS = 1000
MAX_RECALL_QUERY = memory_tools.MAX_RECALL_QUERY
MAX_RECALL_RESULTS = memory_tools.MAX_RECALL_RESULTS
MAX_IMPORT_BYTES = memory_transfer.MAX_FILE_BYTES  # the largest export a server takes

Title = Text(MAX_MEMORY_TITLE_CHARS, blank=False)
MemoryText = Text(MAX_MEMORY_TEXT_CHARS, blank=False)
Tags = Items(Text(MAX_TAG_CHARS, blank=False), MAX_TAGS)
Note = Text(MAX_NOTE_CHARS)
Id = Text(MAX_ID_CHARS, blank=False)
MAX_STORE_CHARS = 40


def _store_name(name: str) -> str:
    try:
        return memory_store.check_store(name)
    except ConfigError as e:
        raise ValueError(str(e).removeprefix("store name ")) from None


class _Review(Body):
    action: str


class _Edits(_Review):
    title: Title | None = None
    text: MemoryText | None = None
    tags: Tags | None = None
    note: Note | None = None
    allow_secret: bool = False  # the person confirms that what looks like a secret is not one


class Accept(_Edits):
    action: Literal["accept"]


class Edit(_Edits):
    action: Literal["edit"]


class Merge(_Edits):
    action: Literal["merge"]
    with_: Items(Id, MAX_MERGE) | None = Field(None, alias="with")


class Reject(_Review):
    action: Literal["reject"]
    note: Note | None = None
    reason: Note | None = None


class Retire(Reject):
    action: Literal["retire"]  # type: ignore[assignment]  # pydantic narrows the field per action


class Redact(_Review):
    action: Literal["redact"]
    reason: Note | None = None
    note: Note | None = None
    title: Title | None = None
    allow_secret: bool = False


class Supersede(_Review):
    action: Literal["supersede"]
    by: Id  # the newer, accepted memory that replaces this one
    note: Note | None = None


# each review action of the store, with exactly the fields it takes
ACTIONS: Mapping[str, type[_Review]] = MappingProxyType({
    "accept": Accept, "reject": Reject, "edit": Edit, "merge": Merge, "retire": Retire, "redact": Redact,
    "supersede": Supersede})


def review_body(body: Any) -> tuple[str, dict[str, Any]]:
    """(action, the action's fields) of a `PATCH /memories/{id}` body."""
    if not isinstance(body, dict):
        raise ConfigError(f"the body must be a JSON object, not {kind_of(body)}")
    if "actor" in body:
        raise ConfigError('"actor" is not a field: a review is recorded as the authenticated user who sends it')
    action = body.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        shown = f" {action[:40]!r}" if isinstance(action, str) else ""
        raise ConfigError(f"unknown review action{shown}; the body needs \"action\": one of {', '.join(REVIEW_ACTIONS)}")
    b = parse(ACTIONS[action], body, what=f"the {action} action")
    fields = {k: v for k, v in b.model_dump(by_alias=True, exclude={"action"}).items() if v is not None and v is not False}
    return action, fields


StoreName = Annotated[Text(MAX_STORE_CHARS, blank=False), AfterValidator(_store_name)]


class DreamBody(Body):
    """`POST /dreams`."""

    sessions: Items(Id, MAX_DREAM_SESSIONS) | None = None
    model: Text(MAX_MODEL_CHARS, blank=False) | None = None
    instructions: Text(MAX_INSTRUCTIONS_CHARS, blank=False) | None = None
    store: StoreName | None = None  # where its proposals go (default: dream_store)


class MemoriesArgs(Body):
    """`GET /memories?status=&tag=&dream=&search=&store=`."""

    status: Literal[STATUSES] | None = None
    tag: Text(MAX_TAG_CHARS) | None = None
    dream: Text(MAX_ID_CHARS) | None = None
    search: Text(MAX_SEARCH_CHARS) | None = None
    store: StoreName | None = None


class ExportArgs(Body):
    """`GET /memories/export?store=`."""

    store: StoreName


class ImportArgs(Body):
    """`POST /memories/import?store=&allow_secret=&review=`."""

    store: StoreName | None = None
    allow_secret: Flag | None = None
    review: Flag | None = None


class RecallArgs(Body):
    """`GET /recall?q=&limit=&store=`."""

    q: Text(MAX_RECALL_QUERY, blank=False)
    store: StoreName | None = None
    limit: Annotated[Digits, AfterValidator(lambda n: within(n, 1, MAX_RECALL_RESULTS))] | None = None


class MemoryHandlerBase(Handler):
    unknown: type[WorkbenchError] = UnknownMemory
    what = "memory"

    @property
    def plugin(self) -> Any:
        """This server's memory plugin (MemoryPlugin)."""
        return self.host.plugin("memory")

    @property
    def store(self) -> Any:
        return self.plugin.require_store()

    def actor(self) -> str:
        """Who acts: the user Jupyter's identity provider authenticated, as person:<username> (never the request's word)."""
        return person(getattr(self.current_user, "username", None) or getattr(self.current_user, "name", None))


class MemoriesHandler(MemoryHandlerBase):
    args = MemoriesArgs

    @web.authenticated
    @api
    async def get(self) -> None:
        q = self.query.model_dump()
        self.reply({"memories": await asyncio.to_thread(lambda: self.store.list(**q))})


class MemoryExportHandler(MemoryHandlerBase):
    """A store as the export format (docs/memory.md, "Export and import"); 404 when no memory is in it."""

    args = ExportArgs

    @web.authenticated
    @api
    async def get(self) -> None:
        name, actor = self.query.store, self.actor()
        self.reply(await asyncio.to_thread(memory_transfer.export_store, self.store, name, actor))


class MemoryImportHandler(MemoryHandlerBase):
    """An export, sent as the body, imported all or nothing; the report of what came in and what was skipped."""

    args = ImportArgs
    max_body = MAX_IMPORT_BYTES

    @web.authenticated
    @api
    async def post(self) -> None:
        if self._chunks is None:
            raise BodyTooLarge(f"the body is {self._size:,} bytes; an export takes at most {self.max_body:,}")
        data, q, actor = b"".join(self._chunks), self.query, self.actor()
        report = await asyncio.to_thread(lambda: memory_transfer.import_store(
            self.store, data, actor, q.store, allow_secret=flag(q.allow_secret) or False,
            review=flag(q.review) or False))
        self.reply(report)


class MemoryHandler(MemoryHandlerBase):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await asyncio.to_thread(self.store.get, id))

    @web.authenticated
    @api
    async def patch(self, id: str) -> None:
        action, kw = review_body(self.body())
        actor = self.actor()
        if action == "merge" and "text" not in kw:
            await asyncio.to_thread(self._merged_text_fits, [id, *kw.get("with", [])])
        self.reply(await asyncio.to_thread(lambda: self.store.review(id, action, actor, **kw)))

    def _merged_text_fits(self, ids: list[str]) -> None:
        """A merge without a text joins the texts of its memories: refuse one that would be over the limit
        (else merging merges would grow a memory without bound)."""
        length = sum(len(self.store.get(i)["text"]) + 2 for i in dict.fromkeys(ids))  # UnknownMemory: 404
        if length - 2 > MAX_MEMORY_TEXT_CHARS:
            raise ConfigError(f"the merged text would be {length - 2:,} characters; give \"text\" "
                              f"(at most {MAX_MEMORY_TEXT_CHARS:,}) for the merged memory")


class RecallHandler(MemoryHandlerBase):
    """Accepted memories ranked by relevance to `q`, as the `recall` tool finds them (each with its `score`)."""

    args = RecallArgs

    @web.authenticated
    @api
    async def get(self) -> None:
        q = self.query

        def find() -> list[dict[str, Any]]:
            limit = q.limit or self.store.settings.recall_results
            stores = [q.store] if q.store is not None else self.store.store_names()
            return [dict(m, score=round(s, 4)) for m, s in self.store.recall(q.q, stores, limit)]

        self.reply({"memories": await asyncio.to_thread(find)})


class DreamsHandler(MemoryHandlerBase):
    unknown, what = UnknownSession, "dream"

    @web.authenticated
    @api
    async def get(self) -> None:
        from .dream import list_dreams

        self.reply({"dreams": await asyncio.to_thread(list_dreams, self.store, self.plugin.driving)})

    @web.authenticated
    @api
    async def post(self) -> None:
        b = parse(DreamBody, self.body())
        if b.model is not None:  # before the dream session is created: a refused model leaves nothing behind
            await asyncio.to_thread(check_model, self.host, b.model)
        dream_id = await self.plugin.start_dream(b.sessions, b.model, b.instructions, b.store)
        self.reply({"dream_id": dream_id, "state": "running"}, 202)


class DreamHandler(MemoryHandlerBase):
    unknown, what = UnknownSession, "dream"

    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        from .dream import dream_status

        running = self.plugin.driving(id)
        self.reply(await asyncio.to_thread(dream_status, self.store, id, running))


class DreamCancelHandler(MemoryHandlerBase):
    unknown, what = UnknownSession, "dream"

    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        from .dream import dream_status

        parse(EmptyBody, self.body())
        cancelled = await self.plugin.cancel(id, self.actor())
        status = await asyncio.to_thread(dream_status, self.store, id, self.plugin.driving(id))
        self.reply({**status, "cancelled": cancelled})


ROUTES: tuple[tuple[str, type], ...] = (
    (f"{API}/memories", MemoriesHandler),
    (f"{API}/memories/export", MemoryExportHandler),  # before memories/{id}: the first route that matches serves
    (f"{API}/memories/import", MemoryImportHandler),
    (f"{API}/memories/{{id}}", MemoryHandler),
    (f"{API}/recall", RecallHandler),
    (f"{API}/dreams", DreamsHandler),
    (f"{API}/dreams/{{id}}", DreamHandler),
    (f"{API}/dreams/{{id}}/cancel", DreamCancelHandler),
)
