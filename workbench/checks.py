"""Checking values before anything is written, strictly, the same for every face.

The building blocks of every checked shape (`Text`, `Int`, `Seconds`, `Items`, `Body`), `parse` (a value
as a pydantic model, or one line that says which field and what is wrong), and the per-session config:
the core's keys and checks, the plugins' (`Plugin.config_checks`), and `session_args`, the one check of a
new session, which the in-process service and the server both use. The server's request bodies
(workbench/server/bodies.py) are made of these. Everything here raises ConfigError (400) and nothing
else, whatever JSON it is given. The limits are documented in docs/api.md ("Limits").
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model

from .attachments import strip_ansi
from .brain.models.base import EFFORTS, THINKING
from .errors import ConfigError, WorkbenchError
from .log import SESSION_ID

log = logging.getLogger("workbench.checks")

# -- limits (docs/api.md, "Limits") ---------------------------------------------------------------------

MAX_NAME_CHARS = 200  # a tool, credential or plugin name
MAX_EGRESS_ALLOW = 256
MAX_HOSTPORT_CHARS = 300
MAX_CREDENTIALS = 64
MAX_ENV = 256
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_CHARS = 10_000
MAX_PATH_CHARS = 4096
MAX_INT = 2**53 - 1  # the largest integer every JSON reader reads exactly
MAX_SECONDS = 1e9

MAX_KEY_CHARS = 128  # a message's idempotency key
IDEMPOTENCY_KEY = rf"^[A-Za-z0-9._:-]{{1,{MAX_KEY_CHARS}}}$"  # a UUID fits, with or without its dashes

# how a value of each pattern is described in a refusal
PATTERNS: Mapping[str, str] = MappingProxyType({
    r"^[0-9]+$": "plain ASCII digits (0-9)",
    SESSION_ID: "an id of at most 200 letters, digits and . _ : @ - (starting with a letter or digit)",
    IDEMPOTENCY_KEY: f"1 to {MAX_KEY_CHARS} letters, digits and . _ : -",
})


# -- building blocks ------------------------------------------------------------------------------------


def valid_unicode(text: str) -> str:
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
    checks = [AfterValidator(valid_unicode)] + ([] if blank else [AfterValidator(_not_blank)])
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


class Body(BaseModel):
    """Base of every body and query model: unknown fields refused, strict types, finite numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


M = TypeVar("M", bound=BaseModel)


# -- a value as a model ---------------------------------------------------------------------------------


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
    from .egress.policy import EgressPolicy

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
    from .hands import HandsConfig

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


def check_model(host: Any, name: str) -> None:
    """UnknownModel / MissingAPIKey now, before anything is written; a maker that breaks on the name refuses it."""
    try:
        host.models.check(name)
    except WorkbenchError:
        raise
    except Exception as e:
        log.warning("workbench: making model %r failed", name[:100], exc_info=True)
        raise ConfigError(f"cannot make model {name[:100]!r} ({type(e).__name__})") from None


def session_args(host: Any, *, id: str | None = None, title: str | None = None, model: str | None = None,
                 system: str | None = None, config: Mapping[str, Any] | None = None,
                 tools: Sequence[str] | None = None, first_message: str | None = None) -> dict[str, Any]:
    """Brain.create_session's arguments, checked against this host before anything is written: the config's
    keys (the core's and the plugins'), the tools (each known, each once) and the model (the host's default
    when none is given)."""
    from .brain.tools import tool_named

    out: dict[str, Any] = {"title": title, "system": system, "model": model or host.models.default_name()}
    if first_message and first_message.strip():
        out["message"] = first_message
    if id is not None:
        out["session_id"] = id
    if config is not None:
        checks = config_checks(host)
        unknown = sorted(set(config) - set(checks))
        if unknown:
            raise ConfigError(f"unknown config key {unknown[0][:40]!r}; known: {', '.join(checks)}")
        for k, v in config.items():
            checks[k](v)
        out["config"] = dict(config)
    if tools is not None:
        seen: set[str] = set()
        for t in tools:
            if t in seen:
                raise ConfigError(f'"tools" names {t[:40]!r} twice; name each tool once')
            seen.add(t)
            tool_named(host.tools, t)  # raises ConfigError naming the known tools
        out["tools"] = list(tools)
    check_model(host, out["model"])
    return out


# -- notebook context on a message (workbench/attachments.py) -------------------------------------------

MAX_ATTACHMENTS = 8  # per message
MAX_ATTACHED_CELLS = 2000  # per attachment
MAX_CELL_ID_CHARS = 200
MAX_SOURCE_CHARS = 200_000  # a cell's source
MAX_CELL_OUTPUTS = 100  # per cell
MAX_OUTPUT_CHARS = 200_000  # an output's text, an error's evalue
MAX_TRACEBACK_LINES = 500
MAX_ATTACHED_CHARS = 1_000_000  # every string of a message's attachments together


class AttachedOutput(Body):
    """One output of an attached cell, as text: a stream, a plain-text result, an error, or a note (an image)."""

    type: Literal["stream", "result", "error", "note"]
    text: Text(MAX_OUTPUT_CHARS) | None = None
    ename: Text(MAX_NAME_CHARS) | None = None
    evalue: Text(MAX_OUTPUT_CHARS) | None = None
    traceback: Items(Text(MAX_OUTPUT_CHARS), MAX_TRACEBACK_LINES) | None = None


class AttachedCell(Body):
    """One attached cell: where it is in its notebook, and what it holds."""

    index: Int(0, 10_000_000)
    id: Text(MAX_CELL_ID_CHARS) | None = None
    cell_type: Literal["code", "markdown", "raw"]
    source: Text(MAX_SOURCE_CHARS)
    outputs: Items(AttachedOutput, MAX_CELL_OUTPUTS) = []


class Attachment(Body):
    """Cells of a notebook, or the notebook (`omitted`: how many of its cells were left out for the budget)."""

    kind: Literal["cells", "notebook"]
    path: Text(MAX_PATH_CHARS, blank=False)
    cells: Annotated[list[AttachedCell], Field(min_length=1, max_length=MAX_ATTACHED_CELLS)]
    omitted: Int(0, 10_000_000) = 0


Attachments = Items(Attachment, MAX_ATTACHMENTS)


class _Attachments(Body):
    attachments: Annotated[list[Attachment], Field(max_length=MAX_ATTACHMENTS)]


def _strings(value: Any) -> Any:
    """Each string of `value` (nested lists and dicts; attachments nest four levels), ANSI escapes taken out."""
    if isinstance(value, str):
        return strip_ansi(value)
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: _strings(v) for k, v in value.items()}
    return value


def check_attachments(value: Any) -> list[dict[str, Any]]:
    """A message's attachments as stored in its `user_message`: checked (ConfigError naming the field), at most
    MAX_ATTACHED_CHARS of text in all, ANSI escapes taken out, absent fields left out."""
    parsed = parse(_Attachments, {"attachments": value}, "the attachments")
    out = [_strings(a.model_dump(exclude_none=True, exclude_defaults=False)) for a in parsed.attachments]
    total = sum(len(c["source"]) + sum(len(o.get("text", "")) + len(o.get("evalue", ""))
                                       + sum(map(len, o.get("traceback", []))) for o in c["outputs"])
                for a in out for c in a["cells"])
    if total > MAX_ATTACHED_CHARS:
        raise ConfigError(f"the attachments hold {total:,} characters; at most {MAX_ATTACHED_CHARS:,} go with a "
                          "message (attach fewer cells)")
    return out
