"""The live feed of every session's websockets: what each watcher hears, encoded once for all of them.

A watcher hears ("event", Event, text) for each committed event of its session, ("delta", stream_event,
text) for the live model stream, ("output", message, text) for the live output of a running tool call
(brain/live.py), and ("closed", None, None) once when the server stops; always on the event loop. `text`
is the websocket message for that item, the same for every socket of the session: JSON-encoded once
per item, not once per socket.

Stream deltas of one content block that arrive in the same turn of the event loop are sent as one
(their texts joined, in order): a model that answers at once (the scripted one, a fast API) costs a
message per block, not one per chunk, and nothing waits for a timer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import orjson

from ..log import Event

Watcher = Callable[[str, Any, "str | None"], None]

# a content_block_delta's type -> the field whose text consecutive deltas join
JOINED = MappingProxyType({"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"})


def wire(kind: str, obj: Any, session_id: str) -> str:
    """The websocket message of an item of a session's feed (docs/api.md, the stream route)."""
    if kind == "event":
        msg = {"kind": "event", "event": obj.to_json()}
    elif kind == "output":
        msg = {"kind": "output", "session_id": session_id, **obj}
    else:
        msg = {"kind": "delta", "session_id": session_id, "event": obj}
    try:
        return orjson.dumps(msg, default=str).decode()
    except (TypeError, orjson.JSONEncodeError):  # e.g. a lone surrogate in a model's text: escaped, as json does
        return json.dumps(msg, default=str)


def joined(last: dict[str, Any], ev: dict[str, Any]) -> dict[str, Any] | None:
    """One delta saying what `last` then `ev` say, when both add text to the same block; else None."""
    if last.get("type") != "content_block_delta" or ev.get("type") != "content_block_delta" or last.get("index") != ev.get("index"):
        return None
    a, b = last.get("delta") or {}, ev.get("delta") or {}
    key = JOINED.get(str(a.get("type")))
    if key is None or a.get("type") != b.get("type") or not isinstance(a.get(key), str) or not isinstance(b.get(key), str):
        return None
    return {**last, "delta": {**a, key: a[key] + b[key]}}


class Fanout:
    """Every session's watchers, and the deltas of this turn of the loop not yet sent."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self._watchers: dict[str, list[Watcher]] = defaultdict(list)
        self._deltas: dict[str, list[dict[str, Any]]] = {}

    def watch(self, session_id: str, fn: Watcher) -> Callable[[], None]:
        """Hear a session's feed (on the loop); returns an unwatch."""
        self._watchers[session_id].append(fn)

        def unwatch() -> None:
            fns = self._watchers.get(session_id)
            if fns and fn in fns:
                fns.remove(fn)
                if not fns:
                    del self._watchers[session_id]

        return unwatch

    def watched(self, session_id: str) -> bool:
        return bool(self._watchers.get(session_id))

    def events(self, events: list[Event]) -> None:
        """Committed events (one commit's, in order): each session's pending deltas go first."""
        for e in events:
            if not self.watched(e.session_id):
                continue
            if e.session_id in self._deltas:
                self._flush(e.session_id)
            self._send(e.session_id, "event", e)

    def delta(self, session_id: str, ev: dict[str, Any]) -> None:
        """A live stream event: joined to the one before it when it can be, sent at the end of this turn of the loop."""
        if not self.watched(session_id):
            return
        pending = self._deltas.get(session_id)
        if pending is None:
            self._deltas[session_id] = [ev]
            asyncio.get_running_loop().call_soon(self._flush, session_id)
            return
        both = joined(pending[-1], ev)
        if both is None:
            pending.append(ev)
        else:
            pending[-1] = both

    def output(self, session_id: str, message: dict[str, Any]) -> None:
        if session_id in self._deltas:
            self._flush(session_id)
        self._send(session_id, "output", message)

    def close(self) -> None:
        """The server stops: every watcher hears `closed`."""
        for sid in list(self._watchers):
            self._call(sid, "closed", None, None)

    def _flush(self, session_id: str) -> None:
        for ev in self._deltas.pop(session_id, ()):
            self._send(session_id, "delta", ev)

    def _send(self, session_id: str, kind: str, obj: Any) -> None:
        if self.watched(session_id):
            self._call(session_id, kind, obj, wire(kind, obj, session_id))

    def _call(self, session_id: str, kind: str, obj: Any, text: str | None) -> None:
        for fn in list(self._watchers.get(session_id, ())):
            try:
                fn(kind, obj, text)
            except Exception:  # one broken watcher must not starve the others
                self.logger.exception("workbench: a stream watcher failed")
