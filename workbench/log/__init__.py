"""The session log: sessions and their append-only events in DuckDB."""

from .events import EVENT_TYPES, Event
from .store import SessionLog, Tx, default_db_path

__all__ = ["EVENT_TYPES", "Event", "SessionLog", "Tx", "default_db_path"]
