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

import dataclasses
import functools
import logging
import math
import types
import typing
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model

from ..brain.models.base import EFFORTS, THINKING
from ..errors import ConfigError, WorkbenchError
from ..log import SESSION_ID

log = logging.getLogger("workbench.server")

# -- limits (docs/api.md, "Limits") ---------------------------------------------------------------------

MAX_BODY_BYTES = 1 << 20  # every body but a message's
MAX_MESSAGE_BODY_BYTES = 4 << 20  # POST /sessions/{id}/messages
MAX_DEPTH = 32  # nesting of objects and arrays in a body (the body itself is level 1)
MAX_ID_CHARS = 1000  # a path id (the log's longest session id)
MAX_TITLE_CHARS = 1000
MAX_MODEL_CHARS = 200
MAX_SYSTEM_CHARS = 100_000
MAX_TEXT_CHARS = 1_000_000  # a user message
MAX_KEY_CHARS = 128  # a message's idempotency key
IDEMPOTENCY_KEY = rf"^[A-Za-z0-9._:-]{{1,{MAX_KEY_CHARS}}}$"  # a UUID fits, with or without its dashes
MAX_TOOLS = 32
MAX_NAME_CHARS = 200  # a tool, credential or plugin name
MAX_SQL_CHARS = 100_000
MAX_PARAMS = 1000  # the log's own query_max_params (default 100) applies as well
MAX_PARAM_CHARS = 100_000
MAX_EGRESS_ALLOW = 256
MAX_HOSTPORT_CHARS = 300
MAX_CREDENTIALS = 64
MAX_ENV = 256
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_CHARS = 10_000
MAX_PATH_CHARS = 4096
MAX_INT = 2**53 - 1  # the largest integer every JSON reader reads exactly
MAX_SECONDS = 1e9
MAX_DIGITS = 18  # `after` and `limit`: below 2**63
MAX_EVENTS_PAGE = 100_000  # `limit` of GET .../events
MAX_SESSIONS_PAGE = 1000  # `limit` of GET /sessions (the log's MAX_PAGE)
MAX_SEARCH_CHARS = 200  # `q` of GET /search (the log's manage.MAX_SEARCH_CHARS)
MAX_SEARCH_PAGE = 100  # `limit` of GET /search (the log's manage.MAX_SEARCH_PAGE)

# how a value of each pattern is described in a refusal
PATTERNS = MappingProxyType({
    r"^[0-9]+$": "plain ASCII digits (0-9)",
    SESSION_ID: "an id of at most 200 letters, digits and . _ : @ - (starting with a letter or digit)",
    IDEMPOTENCY_KEY: f"1 to {MAX_KEY_CHARS} letters, digits and . _ : -",
})

# Jupyter's own query arguments: auth for websockets (browsers cannot send headers) and XSRF
JUPYTER_ARGS = frozenset({"token", "_xsrf"})


# -- building blocks ------------------------------------------------------------------------------------


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (it has a lone surrogate)") from None
    return text


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain a NUL character")
    return text


def Text(max_chars: int, *, blank: bool = True) -> Any:
    """A string of valid Unicode, at most `max_chars` characters (blank=False: not only whitespace)."""
    checks = [AfterValidator(_valid_unicode)] + ([] if blank else [AfterValidator(_not_blank)])
    return Annotated[str, StringConstraints(strict=True, max_length=max_chars), *checks]


def Int(lo: int, hi: int = MAX_INT) -> Any:
    """An integer (not a float, a bool or a string) within [lo, hi]."""
    return Annotated[int, Field(strict=True, ge=lo, le=hi)]


def Seconds() -> Any:
    """A finite number of seconds above 0."""
    return Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


def Items(item: Any, max_items: int) -> Any:
    """A list of at most `max_items` items."""
    return Annotated[list[item], Field(max_length=max_items)]


def _digits(text: str) -> int:
    return int(text)


# plain ASCII digits: no sign, space, underscore or other script's digits ("+1", " 1", "1_0", "١")
Digits = Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9]+$", max_length=MAX_DIGITS), AfterValidator(_digits)]


Flag = Literal["true", "false"]  # a yes/no query argument


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        if len(value) > MAX_PARAM_CHARS:
            raise ValueError(f"is longer than {MAX_PARAM_CHARS:,} characters")
        return _valid_unicode(value)
    if value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise ValueError(f"must be a string, a number, true, false or null, not {kind_of(value)}")


Scalar = Annotated[Any, AfterValidator(_scalar)]


class Body(BaseModel):
    """Base of every body and query model: unknown fields refused, strict types, finite numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


M = TypeVar("M", bound=BaseModel)


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


def parse(model: type[M], value: Any, what: str = "the body", prefix: str = "") -> M:
    """`value` (decoded JSON) as `model`, or ConfigError with one line naming the field and the fault.

    `what` names the whole value in messages; `prefix` goes before field names (e.g. "config.hands.").
    """
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object, not {kind_of(value)}")
    try:
        return model.model_validate(value, strict=True)
    except ValidationError as e:
        raise ConfigError(explain(e, what, model, prefix)) from None


def explain(e: ValidationError, what: str, model: type[BaseModel] | None = None, prefix: str = "") -> str:
    """The first error of a pydantic validation as one line a person can act on."""
    err = e.errors(include_url=False)[0]
    loc = err["loc"]
    field = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p[:40]}" if p.isidentifier() else f"[{p[:40]!r}]"
                             for p in loc).lstrip(".")
    name = f'"{field}"' if field else what
    ctx, t, got = err.get("ctx") or {}, err["type"], err.get("input")
    if t == "extra_forbidden":
        fields = model.model_fields.items() if model is not None and len(loc) == 1 else ()
        known = f"; {what} takes {', '.join(f.alias or n for n, f in fields)}" if fields else ""
        return f"unknown field {name[:60]}{known}"
    if t == "missing":
        return f"{name} is required"
    expected = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
                "list_type": "a list", "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
                "none_required": "null", "int_from_float": "an integer", "finite_number": "a finite number"}
    if t in expected:
        return f"{name} must be {expected[t]}, not {kind_of(got)}"
    if t == "string_unicode":
        return f"{name} is not valid Unicode (it has a lone surrogate)"
    if t == "string_too_long":
        return f"{name} is longer than {ctx['max_length']:,} characters"
    if t == "too_long":
        return f"{name} has more than {ctx['max_length']:,} items"
    if t == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        shape = PATTERNS.get(pattern, f"a string matching {pattern}")
        return f"{name} must be {shape}, not {str(got)[:40]!r}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if t in bounds:
        limit = next(iter(ctx.values()))
        return f"{name} must be {bounds[t]} {limit:,}, not {str(got)[:40]}" if isinstance(limit, int) else \
            f"{name} must be {bounds[t]} {limit}, not {str(got)[:40]}"
    if t == "literal_error":
        return f"{name} must be one of {ctx['expected']}"
    if t == "value_error":
        return f"{name} {str(ctx.get('error') or err['msg']).removeprefix('Value error, ')}"
    return f"{name}: {err['msg']}"


def kind_of(value: Any) -> str:
    """How a JSON value is named in messages: "a string", "an integer", "null", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__)


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
    limit: Annotated[Digits, AfterValidator(lambda n: _within(n, 1, MAX_EVENTS_PAGE))] | None = None


class SessionsArgs(Body):
    """`GET /sessions?kind=&state=&q=&updated_after=&updated_before=&order=&limit=&cursor=`: the log checks the values."""

    kind: Text(MAX_ID_CHARS) | None = None
    state: Text(20) | None = None
    q: Text(MAX_ID_CHARS) | None = None
    updated_after: Text(64) | None = None
    updated_before: Text(64) | None = None
    order: Text(20) | None = None
    limit: Annotated[Digits, AfterValidator(lambda n: _within(n, 1, MAX_SESSIONS_PAGE))] | None = None
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
    limit: Annotated[Digits, AfterValidator(lambda n: _within(n, 1, MAX_SEARCH_PAGE))] | None = None
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


def _within(n: int, lo: int, hi: int) -> int:
    if not lo <= n <= hi:
        raise ValueError(f"must be between {lo} and {hi:,}")
    return n


# -- per-session config: the core's checks and the plugins', robust to anything JSON -----------------------


class _CoreConfig(Body):
    # defaults are never used (only the keys a body has are checked); a key given as null is refused but effort's
    max_tokens: Int(1) = 1
    thinking: Literal[THINKING] = "adaptive"
    effort: Literal[EFFORTS] | None = None
    context: Literal["compact", "clear", "off"] = "compact"
    context_trigger: Int(1000) = 1000


class _Egress(Body):
    # known keys strictly typed here; unknown ones reach EgressPolicy.from_config, which names the known ones
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False, frozen=True)
    allow: Items(Text(MAX_HOSTPORT_CHARS), MAX_EGRESS_ALLOW) | None = None
    credentials: Items(Text(MAX_NAME_CHARS), MAX_CREDENTIALS) | None = None
    max_requests: Int(0) | None = None


def _core_check(key: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        parse(_CoreConfig, {key: value}, what="the config", prefix="config.")

    return check


def _check_egress(value: Any) -> None:
    from ..egress.policy import EgressPolicy

    _nested(_Egress, value, "egress")
    EgressPolicy.from_config(value)


def _check_hands(value: Any) -> None:
    _nested(_hands_model(), value, "hands")


def _nested(model: type[BaseModel], value: Any, key: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f'"config.{key}" must be an object, not {kind_of(value)} (see docs/settings.md)')
    parse(model, value, what=f'"config.{key}"', prefix=f"config.{key}.")


@functools.cache
def _hands_model() -> type[BaseModel]:
    """A strict model of HandsConfig, made from its fields (whatever fields it has now)."""
    from ..hands import HandsConfig

    hints = typing.get_type_hints(HandsConfig)
    env_name = Annotated[Text(MAX_ENV_NAME_CHARS, blank=False), AfterValidator(_env_name)]
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(HandsConfig):
        hint = hints[f.name]
        if hint is bool:
            kind: Any = bool
        elif hint is int:
            kind = Int(1)
        elif hint is float:
            kind = Seconds()
        elif f.name == "env":
            kind = Annotated[dict[env_name, Annotated[Text(MAX_ENV_VALUE_CHARS), AfterValidator(_no_nul)]],
                             Field(max_length=MAX_ENV)]
        elif f.name == "workdir":  # used as it is: a relative one would be under whatever directory the server runs in
            kind = Annotated[Text(MAX_PATH_CHARS), AfterValidator(_no_nul), AfterValidator(_absolute)] | None
        elif typing.get_origin(hint) in (typing.Union, types.UnionType) and str in typing.get_args(hint):
            kind = Annotated[Text(MAX_PATH_CHARS), AfterValidator(_no_nul)] | None
        else:  # a field this module does not know yet: any JSON value (already bounded by the body's checks)
            kind = Any
        fields[f.name] = (kind | None if kind is not Any else Any, None)
    return create_model("HandsConfigBody", __base__=Body, **fields)


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"must be an absolute path, not {path[:40]!r} (a relative one would be under the server's "
                         "working directory)")
    return path


def _env_name(name: str) -> str:
    if "=" in name or "\x00" in name:
        raise ValueError("must not contain '=' or NUL")
    return name


# Per-session config keys of the core and their checks (plugins add theirs: Plugin.config_checks).
CONFIG_CHECKS: Mapping[str, Callable[[Any], None]] = MappingProxyType({
    "max_tokens": _core_check("max_tokens"),
    "thinking": _core_check("thinking"),
    "effort": _core_check("effort"),
    "context": _core_check("context"),
    "context_trigger": _core_check("context_trigger"),
    "hands": _check_hands,
    "egress": _check_egress,
})


def _robust(key: str, check: Callable[[Any], None]) -> Callable[[Any], None]:
    """A check that refuses what it cannot handle with a ConfigError instead of failing the request."""

    def guarded(value: Any) -> None:
        try:
            check(value)
        except WorkbenchError:
            raise
        except Exception as e:  # a check that breaks on a hostile value still refuses it, and says so in the log
            log.warning("workbench: the config check of %r failed on a hostile value", key, exc_info=True)
            raise ConfigError(f'"config.{key}" is not valid ({type(e).__name__})') from None

    return guarded


def config_checks(host: Any) -> dict[str, Callable[[Any], None]]:
    """Every per-session config key this host knows, with its check: the core's and its plugins'."""
    checks = dict(CONFIG_CHECKS)
    for p in host.plugins:
        checks.update(p.config_checks())
    return {k: _robust(k, fn) for k, fn in checks.items()}


def session_body(body: Any, host: Any) -> dict[str, Any]:
    """Arguments for Brain.create_session from a `POST /sessions` body, checked against this host."""
    b = parse(SessionBody, body)
    out: dict[str, Any] = {"title": b.title, "model": b.model, "system": b.system}
    if b.first_message and b.first_message.strip():
        out["message"] = b.first_message
    if b.id is not None:
        out["session_id"] = b.id
    if b.config is not None:
        checks = config_checks(host)
        unknown = sorted(set(b.config) - set(checks))
        if unknown:
            raise ConfigError(f"unknown config key {unknown[0][:40]!r}; known: {', '.join(checks)}")
        for k, v in b.config.items():
            checks[k](v)
        out["config"] = b.config
    if b.tools is not None:
        from ..brain.tools import tool_named

        seen: set[str] = set()
        for t in b.tools:
            if t in seen:
                raise ConfigError(f'"tools" names {t[:40]!r} twice; name each tool once')
            seen.add(t)
            tool_named(host.tools, t)  # raises ConfigError naming the known tools
        out["tools"] = list(b.tools)
    if b.model:
        check_model(host, b.model)
    return out


def check_model(host: Any, name: str) -> None:
    """UnknownModel / MissingAPIKey now, before anything is written; a maker that breaks on the name refuses it."""
    try:
        host.models.check(name)
    except WorkbenchError:
        raise
    except Exception as e:
        log.warning("workbench: making model %r failed", name[:100], exc_info=True)
        raise ConfigError(f"cannot make model {name[:100]!r} ({type(e).__name__})") from None


def message_body(body: Any) -> tuple[str, str | None]:
    """(text, idempotency key or None) of a `POST /sessions/{id}/messages` body."""
    b = parse(MessageBody, body)
    return b.text, b.idempotency_key


def query_body(body: Any) -> tuple[str, list[Any]]:
    """(sql, params) of a `POST /query` body."""
    b = parse(QueryBody, body)
    return b.sql, list(b.params or [])


def empty_body(body: Any) -> None:
    """A route that takes no body: nothing, or `{}`."""
    parse(EmptyBody, body)
