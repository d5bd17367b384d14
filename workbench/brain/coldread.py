"""Reading a session's request from the log when the brain has none kept: a cold resume.

A step costs what is new (request.Conversation); this is the one read that
costs the session, paid when a session is first used by a process (or again
after the brain's session cache dropped it). It reads only what a request and
a turn's state depend on: `session_created`, then the events from the user
message the latest compaction's requests start at (the session row's
`request_from`, which the brain records after a compaction: nothing before it
is sent again), of six event types of the thirteen, and of a tool result only
its id, its error flag and what the model read: its content as stored, or (a
python call's, stored once) its observation, which the content is rendered
from again (hands/observing). Of the user messages before `request_from` it
reads only their idempotency keys (a retry is known whenever it comes). A
`request_from` behind the latest compaction (a process that died before
recording it) costs more events, never a different request. From a DuckDB log the projection runs
in SQL and the payloads arrive as JSON text, parsed here with the garbage
collector paused (building tens of thousands of small objects otherwise
triggers collection after collection over the growing heap). Any other log
is read through its protocol. Both give the same `Conversation` (a test holds
them equal).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import orjson

from ..log import SessionLog, SqlLog
from ..log.payload import decode_payload
from .request import REQUEST_TYPES, Conversation

log = logging.getLogger("workbench.brain")

_TYPES = ", ".join(f"'{t}'" for t in REQUEST_TYPES)
# a tool result reduced to what the request sends (its observation only when no content was stored beside it: a
# result stored before the outputs were stored once repeats them there); every other payload as stored
_SQL = f"""
SELECT seq, type, CASE type
    WHEN 'tool_result' THEN json_object('tool_use_id', payload->'tool_use_id', 'content', payload->'content',
                                        'is_error', payload->'is_error',
                                        'observation', CASE WHEN (payload->'content') IS NULL THEN payload->'observation' END)
    WHEN 'tool_started' THEN json_object('tool_use_id', payload->'tool_use_id')
    ELSE payload END::VARCHAR
FROM events WHERE session_id = ? AND type IN ({_TYPES}) AND seq {{where}}
"""
# the session_created, then the rows from request_from on: each a range of seq given as a value, which DuckDB
# filters while it scans (under `seq = 1 OR seq >= (SELECT ...)` it read every payload of the session first:
# 90 ms instead of 27 for the last 300 events of 100,000, opened cold)
_ROWS_SQL = (f"SELECT * FROM ({_SQL.format(where='= 1')} UNION ALL {_SQL.format(where='>= ?')}) "
             "ORDER BY seq")
_FROM_SQL = "SELECT coalesce(max(request_from), 1) FROM sessions WHERE id = ?"
# the keys of the messages before request_from (the same value the rows were read from: no message is missed)
_KEYS_SQL = """
SELECT seq, payload->>'idempotency_key', payload->>'text' FROM events
WHERE session_id = ? AND type = 'user_message' AND seq > 1 AND seq < ?
  AND payload->>'idempotency_key' IS NOT NULL
ORDER BY seq
"""


def read_conversation(source: SessionLog, session_id: str) -> Conversation:
    """The session's Conversation from its log (blocking: run it off the event loop): a projection in SQL when the
    log has SQL (`log.sql()`), its events otherwise (the in-memory twin)."""
    conv = Conversation()
    sql = source.sql()
    read = _sql_rows(sql, session_id) if sql is not None else None
    if read is None:
        return conv.feed_all(source.events(session_id, types=list(REQUEST_TYPES)))
    rows, keys = read
    for seq, key, text in keys:
        conv.keys.setdefault(key, (seq, text))
    paused = gc.isenabled()
    gc.disable()
    try:
        for seq, type_, raw in rows:
            conv.fold(seq, type_, _payload(raw))
    finally:
        if paused:
            gc.enable()
    return conv


def _sql_rows(source: SqlLog, session_id: str) -> tuple[list[tuple[int, str, str]], list[tuple[int, str, str]]] | None:
    """The projected rows from request_from on, and the (seq, key, text) of keyed messages before it."""
    import duckdb

    cur = source.cursor()
    try:
        start = cur.execute(_FROM_SQL, [session_id]).fetchall()[0][0]
        rows = cur.execute(_ROWS_SQL, [session_id, session_id, max(start, 2)]).fetchall()  # seq 1 once
        return rows, cur.execute(_KEYS_SQL, [session_id, start]).fetchall()
    except duckdb.Error:  # e.g. a row an older version wrote that DuckDB's JSON functions refuse
        log.warning("workbench: the projected read of session %s failed; reading every event", session_id, exc_info=True)
        return None
    finally:
        cur.close()


def _payload(raw: str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return decode_payload(raw)
    return value if isinstance(value, dict) else decode_payload(raw)
