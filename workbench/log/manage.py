"""Managing sessions: rename, archive, delete, fork, search, and the automatic title.

Each operation is one transaction on the log's writer thread, written once here over the
primitives every log's transaction provides (`WriterTx`). The log stays append-only for what
a session says: a rename or an archive is an event (`session_renamed`, `session_archived`) and
the row of `sessions()` follows it in the same transaction. Deletion is the one exception: it
removes the session's rows (its events, its summary row, its session row), all in one
transaction, and refuses while a turn runs (docs/api.md, "Deleting a session").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, TurnBusy, UnknownSession
from .events import Event

MAX_SEARCH_CHARS = 200  # a search's text
MAX_SEARCH_PAGE = 100  # hits in one page of a search
SNIPPET_CHARS = 160  # the text around a hit that a search returns
AUTO_TITLE_CHARS = 60  # an automatic title at most (a cut one ends with "…")
SEARCHED_TYPES = ("user_message", "assistant_turn", "tool_result")  # the events whose text a search reads


# -- automatic titles --------------------------------------------------------------------------------------

_FENCE = re.compile(r"(```|~~~)[^\n]*\n?(.*?)(?:\1|\Z)", re.DOTALL)
_MARKUP = re.compile(r"!?\[([^\]]*)\]\([^)]*\)|[`*_#>|~]+|^\s*[-+]\s+|^\s*\d+[.)]\s+", re.MULTILINE)
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_COMMENT = re.compile(r"^\s*(?:#+|//+|--)\s*")
_ITEM = re.compile(r"^\s*(?:[-+*]|\d+[.)])\s+")


def _first_block(text: str) -> str:
    """What a title is made of: the first heading, or the first paragraph, or the first list's items (comma-joined);
    "" when the text has none (code only)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines):
        return ""
    if _HEADING.match(lines[i]):
        return lines[i]
    if _ITEM.match(lines[i]):
        items = []
        while i < len(lines) and _ITEM.match(lines[i]):
            items.append(_ITEM.sub("", lines[i]).strip())
            i += 1
        return ", ".join(items)
    block = []
    while i < len(lines) and lines[i].strip() and not _HEADING.match(lines[i]) and not _ITEM.match(lines[i]):
        block.append(lines[i])
        i += 1
    return " ".join(block)


def auto_title(text: str, max_chars: int = AUTO_TITLE_CHARS) -> str | None:
    """A title from a first message: its first heading, paragraph or list, without Markdown marks, on one line, cut
    at a word; a message of code only gets its code's first line. None if nothing is left."""
    if not isinstance(text, str):
        return None
    plain = _clean(_MARKUP.sub(lambda m: m.group(1) or " ", _first_block(_FENCE.sub("\n\n", text))))
    if not plain:  # code only: its first line that says something, as written (a comment without its marker)
        lines = (_clean(_COMMENT.sub("", line)) for m in _FENCE.finditer(text) for line in m.group(2).splitlines())
        plain = next((line for line in lines if line), "")
    if not plain:
        return None
    if len(plain) <= max_chars:
        return plain
    cut = plain[: max_chars - 1]
    space = cut.rfind(" ")
    if space >= max_chars // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.-") + "…"


def _clean(text: str) -> str:
    """One line: control and format characters (and a lone surrogate) become spaces, runs of spaces one."""
    return " ".join("".join(c if unicodedata.category(c)[0] != "C" else " " for c in text).split())


# -- what a search reads of an event ----------------------------------------------------------------------


def searchable_text(type_: str, payload: dict[str, Any]) -> str:
    """The words of an event a person would search for: a message's text, a reply's text blocks, a result's text."""
    if type_ == "user_message":
        text = payload.get("text")
        return text if isinstance(text, str) else ""
    if type_ == "assistant_turn":
        content = (payload.get("message") or {}).get("content") if isinstance(payload.get("message"), dict) else None
    elif type_ == "tool_result":
        content = payload.get("content")
        if "content" not in payload:  # a python call's, stored once: the text of its outputs
            return "\n".join(output_words(payload.get("observation")))
    else:
        return ""
    if not isinstance(content, list):
        return ""
    return "\n".join(b["text"] for b in content
                     if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))


def output_words(observation: Any) -> list[str]:
    """The words of a stored observation: its streams' text (and a proposed next input), its displays' and results'
    text/plain, its error's name and value (the duckdb log reads the same in SQL)."""
    if not isinstance(observation, dict):
        return []
    outputs = [o for o in observation.get("outputs") or [] if isinstance(o, dict)]
    error = observation.get("error")
    error = error if isinstance(error, dict) else {}
    words = [o.get("text") for o in outputs]
    words += [o["data"].get("text/plain") for o in outputs if isinstance(o.get("data"), dict)]
    words += [error.get("ename"), error.get("evalue")]
    return [w for w in words if isinstance(w, str)]


def snippet(text: str, needle: str, width: int = SNIPPET_CHARS) -> str:
    """The part of text around the first match of needle (any case), on one line."""
    flat = " ".join(text.split())
    at = flat.lower().find(needle.lower())
    if at < 0:
        return flat[:width]
    start = max(0, at - (width - len(needle)) // 2)
    part = flat[start: start + width]
    return ("…" if start else "") + part + ("…" if start + width < len(flat) else "")


def check_search(text: Any, limit: Any, cursor: Any) -> tuple[str, int, int]:
    """(text, limit, offset) of a search, checked; ValueError says which is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("search text must be a non-empty string")
    if len(text) > MAX_SEARCH_CHARS:
        raise ValueError(f"search text is longer than {MAX_SEARCH_CHARS} characters")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SEARCH_PAGE:
        raise ValueError(f"limit must be an integer from 1 to {MAX_SEARCH_PAGE}, not {limit!r:.40}")
    offset = 0
    if cursor is not None:
        if not isinstance(cursor, str) or not cursor.isascii() or not cursor.isdigit() or len(cursor) > 9:
            raise ValueError("cursor is not one a search gave (pass back `next` as it came)")
        offset = int(cursor)
    return text.strip(), limit, offset


# -- turn boundaries ----------------------------------------------------------------------------------------


def turn_boundary(events: list[Event]) -> int:
    """The last seq of events (in seq order) after which no turn is open: where a fork may end.

    A turn opens with `user_message` and closes with `turn_ended`; a prefix ending inside a turn
    would hand the brain a half turn (a tool call without its result, a model call mid-way), so a
    fork is cut back to the boundary before that turn's `user_message`.
    """
    boundary, open_ = 0, False
    for e in events:
        if e.type == "user_message":
            open_ = True
        elif e.type == "turn_ended":
            open_ = False
        if not open_:
            boundary = e.seq
    return boundary


def turn_running(tx: Any, session_id: str) -> bool:
    """Whether the session's log shows an open turn (read inside tx)."""
    marks = tx.events(session_id, types=["user_message", "turn_ended"])
    return bool(marks) and marks[-1].type == "user_message"


# -- the operations, as functions of a transaction -------------------------------------------------------


def rename(tx: Any, session_id: str, title: str, *, auto: bool = False, only_untitled: bool = False) -> Event | None:
    """Set a session's title and record it (`session_renamed`); with only_untitled, only if it has none yet."""
    if only_untitled and tx.has_title(session_id):  # known without a read: the usual case, every later message
        return None
    row = tx.session_fields(session_id)
    if only_untitled and row["title"]:
        return None
    tx.set_session(session_id, title=title)
    return tx.append(session_id, "session_renamed", {"title": title, "previous": row["title"], "auto": auto})


def archive(tx: Any, session_id: str, archived: bool) -> Event:
    """Archive (or unarchive) a session and record it (`session_archived`)."""
    tx.session_fields(session_id)
    tx.set_session(session_id, archived=archived)
    return tx.append(session_id, "session_archived", {"archived": archived})


def delete(tx: Any, session_id: str, busy: Callable[[str], bool] | None = None) -> int:
    """Remove a session's rows; TurnBusy if its log has an open turn that `busy` says runs. Returns the events removed."""
    tx.session_fields(session_id)
    if turn_running(tx, session_id) and (busy is None or busy(session_id)):
        raise TurnBusy(f"a turn is running in session {session_id!r:.80}; interrupt it before deleting the session")
    return tx.remove_session(session_id)


def fork(tx: Any, origin: str, at: int | None, new_id: str, title: str | None) -> Event:
    """A new session whose events are a copy of origin's up to `at` (cut back to a turn boundary)."""
    row = tx.session_fields(origin)
    if row["kind"] == "dream":
        raise ConfigError("a dream cannot be forked: its read positions belong to it alone")
    events = tx.events(origin, until=at)
    if not events or events[0].type != "session_created":
        raise UnknownSession(f"no session {origin!r:.80}")
    if at is not None and at > events[-1].seq:
        raise ConfigError(f"session {origin!r:.80} has no event {at}; its last is {events[-1].seq}")
    upto = turn_boundary(events)
    first = {k: v for k, v in events[0].payload.items() if k not in ("parent_id", "origin", "forked_from")}
    first["forked_from"] = {"session_id": origin, "seq": upto}
    tx.create(new_id, title if title is not None else row["title"], row["model"], row["kind"])
    created = tx.append(new_id, "session_created", first)
    for e in events[1:]:
        if e.seq > upto:
            break
        if e.type in ("session_renamed", "session_archived"):
            continue  # what a person did to the origin's row, not part of its conversation
        tx.append(new_id, e.type, e.payload)
    return created
