"""The session log's limits: what a payload may be, and what a SQL query may do."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..errors import ConfigError

MAX_DEPTH = 250  # orjson refuses to write deeper than 255 levels


@dataclass(frozen=True)
class LogSettings:
    """Limits of the session log; every field is documented in docs/settings.md ("Session log")."""

    max_payload_bytes: int = 16 * 1024 * 1024  # one event's payload, as stored (compact UTF-8 JSON)
    max_depth: int = 64  # nesting of objects and arrays in a payload
    max_field_chars: int = 1000  # a session's id, title, model and kind
    max_group: int = 1000  # writes committed together in one transaction (a group commit) at most
    group_wait: float = 0.002  # seconds a group may wait for the writers of the group before to come back
    query_timeout: float = 10.0  # seconds before a query is interrupted
    query_max_rows: int = 10_000  # rows a query returns; more are cut and the result says so
    query_max_sql_chars: int = 100_000
    query_max_params: int = 100
    query_max_param_chars: int = 100_000  # one string parameter

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, whole = getattr(self, f.name), isinstance(f.default, int)
            kinds = int if whole else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
                kind = "a positive integer" if whole else "a positive number of seconds"
                raise ConfigError(f"log setting {f.name} must be {kind}, not {value!r:.40}")
        if self.max_depth > MAX_DEPTH:
            raise ConfigError(f"log setting max_depth must be at most {MAX_DEPTH} (the nesting orjson can write)")
