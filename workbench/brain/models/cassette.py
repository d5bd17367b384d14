"""Record and replay of model calls: a cassette file of requests and the responses they got.

A `CassetteModel` wraps another model. Each request the brain sends is keyed
by the SHA-256 of its canonical JSON (keys sorted, no spaces, UTF-8): the whole
Messages API body as `build_request` makes it (model, max_tokens, system,
tools, messages, thinking, output_config, ...). Nothing is left out of the key:
the request is a pure function of the session log and holds nothing volatile
(no times, no session ids; tool_use ids come from recorded responses). What a
kernel printed is part of the request, so code whose output changes from run to
run (times, random numbers, temp paths) makes the next request a miss.

Modes:

- `replay`: answer from the cassette only; a request it does not hold is a
  `CassetteMiss` naming the first path where it differs from the nearest
  recorded request. The inner model is never called (no key, no network).
- `record`: call the inner model for every request and write what it
  streamed; the file starts over at the first write.
- `record-missing`: replay what the cassette holds, call the inner model for
  the rest and append it.

The same request may be recorded several times (epochs, retries): the n-th
time a cassette object is asked for a request it replays the n-th recording.

File format (JSON lines, UTF-8; docs/cassettes.md): a header line
`{"format": "workbench-cassette", "version": 1}`, then one entry per model
call, `{"key", "model", "request", "events", "error"}`: `events` are the
Messages-API stream events exactly as the inner model yielded them (thinking
blocks, signatures, usage and stop reasons included) and `error` is null or
the `RetryableError` / `FatalModelError` that ended the call. Request bodies
and responses only: no headers, no API key, no base URL.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...errors import CassetteError, ConfigError, ModelError
from ...strictnum import NumberRefused, parse_constant, parse_float, parse_int
from .base import FatalModelError, MessageBuilder, Model, RetryableError

FORMAT = "workbench-cassette"
VERSION = 1
MODES = ("replay", "record", "record-missing")
HEADER = MappingProxyType({"format": FORMAT, "version": VERSION})
# The order a request is compared in, so that "the first difference" reads as a person would look.
FIRST_KEYS = ("model", "system", "tools", "max_tokens", "thinking", "output_config", "metadata", "temperature")


class CassetteMiss(FatalModelError, CassetteError):
    """A replayed request the cassette does not hold; the brain records it as a model_error."""


def canonical(request: Any) -> str:
    """The request's canonical JSON: keys sorted, no spaces, non-ASCII kept."""
    try:
        return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise CassetteError(f"a model request is not strict JSON ({e}); it cannot be keyed or recorded") from None


def request_key(request: dict[str, Any]) -> str:
    """The SHA-256 (hex) of the request's canonical JSON: what a cassette entry is found by."""
    return hashlib.sha256(canonical(request).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One recorded model call: the request, the stream events it got, and the error that ended it, if any."""

    key: str
    request: dict[str, Any]
    events: list[dict[str, Any]]
    error: dict[str, Any] | None = None

    def to_line(self) -> str:
        # key and model first, so that a person (or grep) finds an entry; every object inside has sorted keys
        fields = {"key": self.key, "model": self.request.get("model"), "request": self.request,
                  "events": self.events, "error": self.error}
        return "{" + ",".join(f"{json.dumps(k)}:{_line(v)[:-1]}" for k, v in fields.items()) + "}\n"

    def raise_error(self) -> None:
        """Raise the error the recorded call ended with (nothing if it succeeded)."""
        if self.error is None:
            return
        e = self.error
        if e.get("kind") == "retryable":
            raise RetryableError(e.get("message", ""), e.get("status"), e.get("retry_after"))
        raise FatalModelError(e.get("message", ""), e.get("status"))


def _line(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from somewhere: escape it, the JSON value stays the same
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return text + "\n"


class Cassette:
    """A cassette file and the recordings read from it; one object is shared by every model it wraps."""

    def __init__(self, path: str | os.PathLike[str], mode: str = "replay"):
        if mode not in MODES:
            raise ConfigError(f"cassette mode {mode!r} is not one of {', '.join(MODES)}")
        self.path = Path(path).expanduser()
        self.mode = mode
        self._lock = threading.Lock()
        self._entries: dict[str, list[Entry]] = {}
        self._asked: dict[str, int] = {}
        self._fresh = mode == "record"  # record starts the file over at its first write
        if mode == "replay" and not self.path.is_file():
            raise CassetteError(f"cassette {self.path} does not exist; record it first (mode record or record-missing)")
        if mode != "record" and self.path.is_file():
            for entry in read_entries(self.path):
                self._entries.setdefault(entry.key, []).append(entry)

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def entries(self) -> list[Entry]:
        """Every recording this object holds (read from the file or recorded since), grouped by request."""
        with self._lock:
            return [e for es in self._entries.values() for e in es]

    def unplayed(self) -> list[Entry]:
        """The recordings no call has used yet (after a replay: what the run did not ask for)."""
        with self._lock:
            return [e for key, es in self._entries.items() for e in es[self._asked.get(key, 0):]]

    def take(self, request: dict[str, Any]) -> Entry | None:
        """The next unplayed recording of `request`, or None."""
        key = request_key(request)
        with self._lock:
            recorded = self._entries.get(key, [])
            n = self._asked.get(key, 0)
            if n >= len(recorded):
                return None
            self._asked[key] = n + 1
            return recorded[n]

    def record(self, request: dict[str, Any], events: list[dict[str, Any]], error: dict[str, Any] | None) -> Entry:
        """Append one model call to the file (and to what this object replays)."""
        entry = Entry(request_key(request), request, events, error)
        data = entry.to_line().encode("utf-8")
        with self._lock:
            self._write(data)
            self._entries.setdefault(entry.key, []).append(entry)
            self._asked[entry.key] = self._asked.get(entry.key, 0) + 1  # this call used it
        return entry

    def _start_file(self) -> None:
        """Put a file holding only the header in place, whole: a reader never finds the cassette empty.

        Written beside it and linked in (the first writer wins, another's file stays) or, when recording starts
        over, renamed over the old one; created empty and filled later, a reader in between read no header."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, _line(dict(HEADER)).encode())
            finally:
                os.close(fd)
            if self._fresh:
                os.replace(tmp, self.path)
            else:
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    pass
        finally:
            tmp.unlink(missing_ok=True)

    def _write(self, data: bytes) -> None:
        try:
            if self._fresh or not self.path.exists():
                self._start_file()
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except OSError as e:
            raise CassetteError(f"cannot write cassette {self.path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another process recording into the same file waits its turn
            size = os.fstat(fd).st_size
            if size == 0:
                data = _line(dict(HEADER)).encode() + data
            elif os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            self._fresh = False
        finally:
            os.close(fd)

    def miss(self, request: dict[str, Any]) -> CassetteMiss:
        """The error for a request the cassette cannot answer: which path changed, against the nearest recording."""
        key = request_key(request)
        where = f"cassette {self.path}"
        hint = "re-record it (WORKBENCH_CASSETTE_MODE=record-missing, with the real model) if the change is intended"
        with self._lock:
            times = len(self._entries.get(key, []))
            recorded = [es[0].request for es in self._entries.values()]
        if times:
            return CassetteMiss(f"{where} recorded this request {times} time(s) and it is asked once more "
                                f"(more epochs or retries than when it was recorded); {hint}")
        head = f"{where} has no recording of this request (model {str(request.get('model'))[:80]!r}, " \
               f"{len(request.get('messages') or [])} messages)"
        if not recorded:
            return CassetteMiss(f"{head}; it holds no recordings at all; {hint}")
        try:
            best = max((difference(request, r) for r in recorded), key=_closeness)
        except RecursionError:
            return CassetteMiss(f"{head}; it is nested too deeply to compare with the recordings; {hint}")
        return CassetteMiss(f"{head}; the nearest recorded request differs first at {best.path}: {_contrast(best)}; {hint}")


class CassetteModel:
    """A Model that answers from a cassette and, when recording, from the inner model it wraps."""

    def __init__(self, name: str, cassette: Cassette, inner: Model | Callable[[], Model]):
        self.name = name
        self.cassette = cassette
        self._inner: Model | None = inner if isinstance(inner, Model) else None
        self._make_inner = None if isinstance(inner, Model) else inner

    def inner(self) -> Model:
        """The wrapped model, made on first need (a replay never needs it, nor its key)."""
        if self._inner is None:
            assert self._make_inner is not None
            self._inner = self._make_inner()
        return self._inner

    async def stream(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        if self.cassette.mode != "record":
            entry = self.cassette.take(request)
            if entry is not None:
                for ev in entry.events:
                    yield json.loads(json.dumps(ev))  # a copy: a listener may keep or change what it is given
                    await asyncio.sleep(0)
                entry.raise_error()
                return
            if self.cassette.mode == "replay":
                raise self.cassette.miss(request)
        try:
            inner = self.inner()
        except ModelError as e:  # e.g. no key: a miss in record-missing mode is still a miss
            raise CassetteMiss(f"{self.cassette.miss(request)}; and the model to record it with cannot be made: {e}") from None
        events: list[dict[str, Any]] = []
        try:
            async for ev in inner.stream(request):
                events.append(json.loads(_line(ev)))  # as it is now: a listener may change the dict later
                yield ev
        except RetryableError as e:
            self.cassette.record(request, events, {"kind": "retryable", "message": str(e), "status": e.status,
                                                   "retry_after": e.retry_after})
            raise
        except FatalModelError as e:
            self.cassette.record(request, events, {"kind": "fatal", "message": str(e), "status": e.status})
            raise
        problem = fold_problem(events)  # the brain will fail on such a stream: replay fails the same way
        self.cassette.record(request, events, None if problem is None else {"kind": "fatal", "message": problem, "status": None})

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


# -- reading a file ----------------------------------------------------------------------------------------


def read_entries(path: Path) -> list[Entry]:
    """Every entry of a cassette file, checked; CassetteError says which line is wrong and how."""
    try:
        with open(path, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # not while another process appends an entry
            data = f.read()
    except OSError as e:
        raise CassetteError(f"cannot read cassette {path}: {e.strerror}") from None
    if not data:
        raise CassetteError(f"cassette {path} is empty (no header line): record it again")
    lines = data.split(b"\n")
    cut = lines[-1] != b""  # the last line has no newline: a write may have been cut off
    if not cut:
        lines.pop()
    entries: list[Entry] = []
    for n, raw in enumerate(lines, 1):
        obj = _parse_line(path, n, raw, last=cut and n == len(lines))
        if n == 1:
            if obj != dict(HEADER):
                raise CassetteError(f"cassette {path} line 1 is not the header {json.dumps(dict(HEADER))}: "
                                    "not a workbench cassette, or of another version")
            continue
        entries.append(_entry(path, n, obj))
    return entries


def _parse_line(path: Path, n: int, raw: bytes, last: bool) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CassetteError(f"cassette {path} line {n} is not UTF-8 (byte {e.start}): the file is corrupt; "
                            "restore it (e.g. from git) or record it again") from None
    try:
        return json.loads(text, parse_constant=parse_constant, parse_int=parse_int, parse_float=parse_float)
    except NumberRefused as e:
        raise CassetteError(f"cassette {path} line {n} is not valid JSON ({e}): the file is corrupt; "
                            "restore it (e.g. from git) or record it again") from None
    except RecursionError:
        raise CassetteError(f"cassette {path} line {n} is nested too deeply to be a recording: the file is corrupt; "
                            "restore it (e.g. from git) or record it again") from None
    except ValueError as e:
        if last:
            raise CassetteError(f"cassette {path} ends in the middle of line {n} (cut off while recording?): "
                                "remove that line or record it again") from None
        raise CassetteError(f"cassette {path} line {n} is not valid JSON ({e}): the file is corrupt; "
                            "restore it (e.g. from git) or record it again") from None


def _entry(path: Path, n: int, obj: Any) -> Entry:
    where = f"cassette {path} line {n}"
    if not isinstance(obj, dict):
        raise CassetteError(f"{where} is not an entry (a JSON object)")
    request, events, error = obj.get("request"), obj.get("events"), obj.get("error")
    if not isinstance(request, dict) or not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise CassetteError(f"{where} needs a `request` object and a list of `events` objects")
    if error is not None and not (isinstance(error, dict) and error.get("kind") in ("retryable", "fatal")):
        raise CassetteError(f"{where}: `error` must be null or an object with kind retryable or fatal")
    if error is None and fold_problem(events):
        raise CassetteError(f"{where}: its `events` do not make a whole message (edited by hand, or cut short?); record it again")
    key = request_key(request)
    if obj.get("key") != key:
        raise CassetteError(f"{where}: its key is not the hash of its request (edited by hand?); record it again")
    return Entry(key, request, events, error)


def fold_problem(events: list[dict[str, Any]]) -> str | None:
    """Why the events do not fold into a message the way the brain folds them, or None."""
    builder = MessageBuilder()
    try:
        for ev in events:
            builder.feed(json.loads(json.dumps(ev)))
        return None if isinstance(builder.result().get("content"), list) else "the message has no content list"
    except FatalModelError as e:
        return str(e)
    except (LookupError, TypeError, ValueError, AttributeError) as e:
        return f"the model's stream is malformed ({type(e).__name__}: {e})"


# -- where two requests differ -----------------------------------------------------------------------------

_ABSENT = object()


@dataclass(frozen=True)
class Difference:
    """The first path where two requests differ, and how many values agreed before it."""

    path: str
    agreed: int
    now: Any
    recorded: Any


def difference(now: Any, recorded: Any) -> Difference:
    """Where `now` first differs from `recorded`, walking model, system, tools, ..., then messages."""
    found, agreed = _walk(now, recorded, "", 0)
    return found or Difference("(nowhere: the requests are equal)", agreed, _ABSENT, _ABSENT)


def _ordered(keys: Iterable[str]) -> list[str]:
    keys = set(keys)
    rest = sorted(k for k in keys if k not in FIRST_KEYS and k != "messages")
    return [k for k in FIRST_KEYS if k in keys] + rest + (["messages"] if "messages" in keys else [])


def _walk(a: Any, b: Any, path: str, agreed: int) -> tuple[Difference | None, int]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in _ordered(a.keys() | b.keys()):
            p = f"{path}.{k}" if path else str(k)
            found, agreed = _walk(a.get(k, _ABSENT), b.get(k, _ABSENT), p, agreed)
            if found:
                return found, agreed
        return None, agreed
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            found, agreed = _walk(a[i] if i < len(a) else _ABSENT, b[i] if i < len(b) else _ABSENT, f"{path}[{i}]", agreed)
            if found:
                return found, agreed
        return None, agreed
    if type(a) is type(b) and a == b:
        return None, agreed + 1
    return Difference(path or "(the whole request)", agreed, a, b), agreed


def _closeness(d: Difference) -> tuple[int, int]:
    """How near a recording is: the values agreed before the first difference, then (among recordings that
    differ at the same place, e.g. an eval's first requests at their prompt) how much of the differing text
    agrees at its start and its end."""
    a, b = d.now, d.recorded
    if not (isinstance(a, str) and isinstance(b, str)):
        return d.agreed, 0
    head = len(os.path.commonprefix([a, b]))
    tail = len(os.path.commonprefix([a[head:][::-1], b[head:][::-1]]))
    return d.agreed, head + tail


def _contrast(d: Difference) -> str:
    """'recorded X, now Y', long strings cut to the window around their first differing character."""
    a, b = d.recorded, d.now
    if isinstance(a, str) and isinstance(b, str) and max(len(a), len(b)) > 60:
        i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        lo = max(0, i - 20)

        def window(t: str) -> str:
            return repr(("..." if lo else "") + t[lo:i + 40] + ("..." if len(t) > i + 40 else ""))
        return f"at character {i}, recorded {window(a)}, now {window(b)}"
    return f"recorded {_show(a)}, now {_show(b)}"


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "nothing"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
