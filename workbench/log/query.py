"""SQL over the log from outside (`POST /query`): one SELECT, read-only, bounded.

Each rule stands on its own, so a hole in one is caught by the next:

- DuckDB's own parser must find exactly one statement, and it must be a SELECT
  (`DESCRIBE`, `SHOW`, `SUMMARIZE`, `FROM ...` and `VALUES` are SELECTs too);
- it runs in a READ ONLY transaction that is always rolled back;
- the database was opened without access to any other file and with its
  configuration locked (see duckdb_log.CONFIG), so `read_csv`, `COPY`, `ATTACH`
  and `SET` reach nothing;
- it is interrupted after `query_timeout` seconds, and at most `query_max_rows`
  rows come back (`truncated` says when more were there);
- parameters are JSON scalars of bounded size: nothing for DuckDB to convert at length.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import duckdb

from ..errors import QueryRefused
from .payload import encodable
from .settings import LogSettings


@dataclass(frozen=True)
class QueryResult:
    """What a query returned: its column names, at most `query_max_rows` rows, and whether more were cut."""

    columns: list[str]
    rows: list[tuple]
    truncated: bool


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def parse_select(sql: Any, settings: LogSettings) -> duckdb.Statement:
    """The one SELECT statement of sql, or QueryRefused saying why not."""
    if not isinstance(sql, str) or not sql.strip():
        raise QueryRefused("give one SELECT statement as text")
    if len(sql) > settings.query_max_sql_chars:
        raise QueryRefused(
            f"the query is {len(sql):,} characters; at most {settings.query_max_sql_chars:,} (log setting query_max_sql_chars)"
        )
    if not encodable(sql):
        raise QueryRefused("the query is not valid Unicode (it has a lone surrogate)")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryRefused(f"SQL error: {_first_line(e)}") from None
    if len(statements) != 1:
        raise QueryRefused(f"give exactly one statement, not {len(statements)}")
    (statement,) = statements
    if statement.type != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only SELECT (or WITH, FROM, DESCRIBE, SHOW, ...) reads the log; this is {statement.type.name}")
    return statement


def check_params(params: Any, settings: LogSettings) -> list[Any]:
    """The parameters as a list of JSON scalars, or QueryRefused naming the first bad one."""
    if not isinstance(params, (list, tuple)):
        raise QueryRefused(f"params must be a list of JSON scalars, not {type(params).__name__}")
    params = list(params)
    if len(params) > settings.query_max_params:
        raise QueryRefused(f"{len(params)} parameters; at most {settings.query_max_params} (log setting query_max_params)")
    for i, p in enumerate(params, 1):
        if p is None or isinstance(p, bool):
            continue
        if isinstance(p, int):
            if not -(2**63) <= p < 2**63:
                raise QueryRefused(f"parameter {i} is an integer outside 64 bits")
        elif isinstance(p, float):
            if not math.isfinite(p):
                raise QueryRefused(f"parameter {i} is {p}; give a finite number")
        elif isinstance(p, str):
            if len(p) > settings.query_max_param_chars:
                raise QueryRefused(
                    f"parameter {i} is {len(p):,} characters; at most {settings.query_max_param_chars:,} "
                    "(log setting query_max_param_chars)"
                )
            if not encodable(p):
                raise QueryRefused(f"parameter {i} is not valid Unicode (it has a lone surrogate)")
        else:
            raise QueryRefused(f"parameter {i} is a {type(p).__name__}; only strings, numbers, true/false and null")
    return params


def run_query(cur: duckdb.DuckDBPyConnection, sql: Any, params: Any, settings: LogSettings) -> QueryResult:
    """Run sql on cur (a cursor of its own, closed here) under every rule above."""
    try:
        statement = parse_select(sql, settings)
        params = check_params(params, settings)
        cur.execute("BEGIN TRANSACTION READ ONLY")
        timer = threading.Timer(settings.query_timeout, cur.interrupt)
        timer.daemon = True
        timer.start()
        try:
            res = cur.execute(statement, params)
            columns = [d[0] for d in res.description] if res.description else []
            rows = res.fetchmany(settings.query_max_rows + 1)
        except duckdb.InterruptException:
            raise QueryRefused(
                f"the query ran longer than {settings.query_timeout:g} s and was stopped (log setting query_timeout)"
            ) from None
        except duckdb.Error as e:
            raise QueryRefused(f"SQL error: {_first_line(e)}") from None
        finally:
            timer.cancel()
            timer.join()
    finally:
        # closing the cursor also rolls back, should ROLLBACK itself be interrupted by a late timer
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass
        cur.close()
    return QueryResult(columns, rows[: settings.query_max_rows], len(rows) > settings.query_max_rows)
