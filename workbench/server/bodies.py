"""Checking requests at the edge, before anything is written: bodies and query arguments, strictly.

A body goes through three steps; each refuses with one line that says which field and what is wrong:

1. its size, counted while it arrives (handlers.WorkbenchHandler): over the route's limit is a 413,
   and no more of it is kept than the limit;
2. strict JSON (`decode`): UTF-8, no NaN, Infinity or number too big for a double, no lone surrogate
   (orjson refuses all of these), then a nesting limit checked without recursion, before anything
   recursive (pydantic, the config checks, the log) sees it;
3. a pydantic model of the route's shape (`parse`): unknown fields refused, strict types (no "1" for
   1, no 1.0 for 1, no true for 1), finite numbers, valid and bounded strings, bounded lists.

Query arguments (`query_args`) are plain ASCII digits where a number is meant, each given once, no
unknown names. The limits are documented in docs/api.md ("Limits"). Everything here raises
ConfigError (400) or BodyTooLarge (413); the handlers map errors to statuses in one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, Field, StringConstraints, ValidationError

from ..checks import (
    IDEMPOTENCY_KEY,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    Attachments,
    Body,
    Int,
    Items,
    M,
    Text,
    check_attachments,
    explain,
    kind_of,
    parse,
    valid_unicode,
)
from ..errors import ConfigError, WorkbenchError
from ..log import SESSION_ID

# -- limits (docs/api.md, "Limits") ---------------------------------------------------------------------

MAX_BODY_BYTES = 1 << 20  # every body but a message's
MAX_MESSAGE_BODY_BYTES = 4 << 20  # POST /sessions/{id}/messages
MAX_DEPTH = 32  # nesting of objects and arrays in a body (the body itself is level 1)
MAX_ID_CHARS = 1000  # a path id (the log's longest session id)
MAX_TITLE_CHARS = 1000
MAX_MODEL_CHARS = 200
MAX_SYSTEM_CHARS = 100_000
MAX_TEXT_CHARS = 1_000_000  # a user message
MAX_TOOLS = 32
MAX_SQL_CHARS = 100_000
MAX_PARAMS = 1000  # the log's own query_max_params (default 100) applies as well
MAX_PARAM_CHARS = 100_000
MAX_DIGITS = 18  # `after` and `limit`: below 2**63
MAX_EVENTS_PAGE = 100_000  # `limit` of GET .../events
MAX_SESSIONS_PAGE = 1000  # `limit` of GET /sessions (the log's MAX_PAGE)
MAX_SEARCH_CHARS = 200  # `q` of GET /search (the log's manage.MAX_SEARCH_CHARS)
MAX_SEARCH_PAGE = 100  # `limit` of GET /search (the log's manage.MAX_SEARCH_PAGE)

# Jupyter's own query arguments: auth for websockets (browsers cannot send headers) and XSRF
JUPYTER_ARGS = frozenset({"token", "_xsrf"})


# -- building blocks of query arguments (the others are workbench/checks.py's) ---------------------------


def _digits(text: str) -> int:
    return int(text)


# plain ASCII digits: no sign, space, underscore or other script's digits ("+1", " 1", "1_0", "١")
Digits = Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9]+$", max_length=MAX_DIGITS), AfterValidator(_digits)]


Flag = Literal["true", "false"]  # a yes/no query argument


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        if len(value) > MAX_PARAM_CHARS:
            raise ValueError(f"is longer than {MAX_PARAM_CHARS:,} characters")
        return valid_unicode(value)
    if value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise ValueError(f"must be a string, a number, true, false or null, not {kind_of(value)}")


Scalar = Annotated[Any, AfterValidator(_scalar)]


# -- step 2: strict JSON ---------------------------------------------------------------------------------


def decode(raw: bytes) -> Any:
    """The JSON of a request body, strictly; an empty body is {}."""
    if not raw or not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        reason = str(e).split(": line ")[0]
        if "not valid UTF-8" in reason:
            reason = "it is not valid UTF-8"
        elif "surrogate" in reason:
            reason += " (a lone \\ud800-\\udfff escape is not valid Unicode)"
        elif "expected a JSON value" in reason and any(w in raw for w in (b"NaN", b"Infinity")):
            reason += " (NaN and Infinity are not JSON)"
        raise ConfigError(f"the body is not strict JSON: {reason}") from None
    if not _depth_within(value, MAX_DEPTH):
        raise ConfigError(f"the body nests objects and arrays deeper than {MAX_DEPTH} levels")
    return value


def _depth_within(value: Any, limit: int) -> bool:
    # iterative: a body nested a thousand deep costs no stack
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return False
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


# -- step 3: the route's shape ---------------------------------------------------------------------------


def query_args(model: type[M], arguments: Mapping[str, list[bytes]]) -> M:
    """A request's query arguments as `model`: each at most once, UTF-8, no unknown names (Jupyter's own and
    JupyterLab's cache-buster aside)."""
    values: dict[str, str] = {}
    for name, raw in arguments.items():
        if name in JUPYTER_ARGS or (name.isascii() and name.isdigit() and raw == [b""]):
            continue  # Jupyter's own, or JupyterLab's cache-buster (`?1796069398248`, the time, with no value)
        shown = repr(name[:40])
        if len(raw) > 1:
            raise ConfigError(f"query argument {shown} is given {len(raw)} times; give it once")
        try:
            values[name] = raw[0].decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"query argument {shown} is not valid UTF-8") from None
    try:
        return model.model_validate(values, strict=True)
    except ValidationError as e:
        message = explain(e, "the query", model)
        if e.errors()[0]["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields) or "no arguments"
            message = f"unknown query argument {str(e.errors()[0]['loc'][0])[:40]!r}; this route takes {known}"
        raise ConfigError(message) from None


def path_id(value: str, unknown: type[WorkbenchError], what: str) -> str:
    """A path id that can name something: at most MAX_ID_CHARS printable characters, else `unknown` (404)."""
    if len(value) > MAX_ID_CHARS or not value.isprintable():
        raise unknown(f"no {what} {value[:40]!r}{'...' if len(value) > 40 else ''}")
    return value


# -- the core's bodies and query arguments ---------------------------------------------------------------


class SessionBody(Body):
    """`POST /sessions`."""

    id: Annotated[str, StringConstraints(strict=True, pattern=SESSION_ID)] | None = None
    title: Text(MAX_TITLE_CHARS) | None = None
    model: Text(MAX_MODEL_CHARS) | None = None
    system: Text(MAX_SYSTEM_CHARS) | None = None
    config: dict[str, Any] | None = None
    tools: Items(Text(MAX_NAME_CHARS), MAX_TOOLS) | None = None
    # the first message the client is about to send: what memories are ranked by (it is not sent)
    first_message: Text(MAX_TEXT_CHARS) | None = None


class MessageBody(Body):
    """`POST /sessions/{id}/messages`."""

    text: Text(MAX_TEXT_CHARS, blank=False)
    # the client's name for this message: sent again with the same key, it is recorded once (docs/api.md)
    idempotency_key: Annotated[str, StringConstraints(strict=True, pattern=IDEMPOTENCY_KEY)] | None = None
    # notebook context sent with the text (workbench/attachments.py, docs/api.md "Notebook context")
    attachments: Attachments | None = None


class QueryBody(Body):
    """`POST /query`."""

    sql: Text(MAX_SQL_CHARS, blank=False)
    params: Items(Scalar, MAX_PARAMS) | None = None


class EmptyBody(Body):
    """The routes that take no body: nothing, or `{}`."""


class NoArgs(Body):
    """The routes that take no query arguments."""


class EventsArgs(Body):
    """`GET /sessions/{id}/events?after=&limit=`."""

    after: Digits | None = None
    limit: Annotated[Digits, AfterValidator(lambda n: within(n, 1, MAX_EVENTS_PAGE))] | None = None


class SessionsArgs(Body):
    """`GET /sessions?kind=&state=&q=&updated_after=&updated_before=&order=&limit=&cursor=`: the log checks the values."""

    kind: Text(MAX_ID_CHARS) | None = None
    state: Text(20) | None = None
    q: Text(MAX_ID_CHARS) | None = None
    updated_after: Text(64) | None = None
    updated_before: Text(64) | None = None
    order: Text(20) | None = None
    limit: Annotated[Digits, AfterValidator(lambda n: within(n, 1, MAX_SESSIONS_PAGE))] | None = None
    cursor: Text(8192) | None = None
    archived: Flag | None = None


def flag(value: str | None) -> bool | None:
    """A Flag query argument as a bool (None when absent)."""
    return None if value is None else value == "true"


class SessionPatchBody(Body):
    """`PATCH /sessions/{id}`: a new title, archived or not; at least one."""

    title: Text(MAX_TITLE_CHARS, blank=False) | None = None
    archived: Annotated[bool, Field(strict=True)] | None = None


class ForkBody(Body):
    """`POST /sessions/{id}/fork`."""

    seq: Int(1) | None = None
    id: Annotated[str, StringConstraints(strict=True, pattern=SESSION_ID)] | None = None
    title: Text(MAX_TITLE_CHARS, blank=False) | None = None


class SearchArgs(Body):
    """`GET /search?q=&limit=&cursor=&kind=&archived=`."""

    q: Text(MAX_SEARCH_CHARS, blank=False)
    limit: Annotated[Digits, AfterValidator(lambda n: within(n, 1, MAX_SEARCH_PAGE))] | None = None
    cursor: Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9]{1,9}$")] | None = None
    kind: Text(MAX_ID_CHARS) | None = None
    archived: Flag | None = None


def patch_body(body: Any) -> tuple[str | None, bool | None]:
    """(title, archived) of a `PATCH /sessions/{id}` body; at least one is given."""
    b = parse(SessionPatchBody, body)
    if b.title is None and b.archived is None:
        raise ConfigError('give "title" or "archived" (or both)')
    return b.title, b.archived


def fork_body(body: Any) -> ForkBody:
    """A `POST /sessions/{id}/fork` body."""
    return parse(ForkBody, body)


class StreamArgs(Body):
    """`websocket /sessions/{id}/stream?after=`."""

    after: Digits | None = None


FILE_KINDS = ("file", "dataframe", "array", "pickle", "json", "text", "cell", "selection")


class UploadArgs(Body):
    """`POST /sessions/{id}/files?path=&name=&kind=`: the path is checked by hands/files.py."""

    path: Text(MAX_PATH_CHARS, blank=False)
    name: Text(MAX_NAME_CHARS) | None = None
    kind: Literal[FILE_KINDS] | None = None


class FileArgs(Body):
    """`GET /sessions/{id}/files/content?path=`."""

    path: Text(MAX_PATH_CHARS, blank=False)


def within(n: int, lo: int, hi: int) -> int:
    if not lo <= n <= hi:
        raise ValueError(f"must be between {lo} and {hi:,}")
    return n


def message_body(body: Any) -> tuple[str, str | None, list[dict[str, Any]] | None]:
    """(text, idempotency key or None, attachments or None) of a `POST /sessions/{id}/messages` body."""
    b = parse(MessageBody, body)
    # the shape is the body's; the whole (its total size, ANSI taken out) is the one check the service makes too
    attachments = check_attachments(body["attachments"]) if b.attachments is not None else None
    return b.text, b.idempotency_key, attachments


def query_body(body: Any) -> tuple[str, list[Any]]:
    """(sql, params) of a `POST /query` body."""
    b = parse(QueryBody, body)
    return b.sql, list(b.params or [])


def empty_body(body: Any) -> None:
    """A route that takes no body: nothing, or `{}`."""
    parse(EmptyBody, body)
