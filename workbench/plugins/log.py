"""What a plugin reads and writes in the session log: events, the log's protocols (the events of sessions,
and the SQL capability a log may offer for a plugin's own tables), session ids, and scrubbing."""

from __future__ import annotations

from ..log import SESSION_ID, Event, SessionLog, SqlLog, is_session_id
from ..log.duckdb_log import one_row
from ..log.scrub import scrub_text

__all__ = ["SESSION_ID", "Event", "SessionLog", "SqlLog", "is_session_id", "one_row", "scrub_text"]
