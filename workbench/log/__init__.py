"""The session log: sessions and their append-only events.

`SessionLog` is the protocol the brain and the server use; `DuckDBLog` keeps the
log in a DuckDB file, `MemoryLog` is its in-memory twin for tests.
"""

from .duckdb_log import DuckDBLog, Tx as DuckDBTx, default_db_path
from .events import EVENT_TYPES, SESSION_ID, Event, is_session_id
from .memory_log import MemoryLog
from .protocol import ManagedLog, SessionLog, SqlLog, SqlTx, Tx
from .query import QueryResult
from .settings import LogSettings

__all__ = [
    "EVENT_TYPES",
    "DuckDBLog",
    "DuckDBTx",
    "Event",
    "LogSettings",
    "MemoryLog",
    "QueryResult",
    "SESSION_ID",
    "ManagedLog",
    "SessionLog",
    "SqlLog",
    "SqlTx",
    "Tx",
    "default_db_path",
    "is_session_id",
]
