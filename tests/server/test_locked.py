"""A server whose database another process holds still answers, with 503 and the reason."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture
def held_db(tmp_path):
    """A DuckDB file held open for writing by another process (as a running `workbench run` would)."""
    path = tmp_path / "held.duckdb"
    code = "import duckdb, sys; con = duckdb.connect(sys.argv[1]); print('ready', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        yield path
    finally:
        holder.kill()
        holder.wait(10)


@pytest.fixture
def jp_server_config(held_db):
    return {
        # terminals off: pytest-jupyter adds them unless told, and they are not ours to test
        "ServerApp": {"jpserver_extensions": {"workbench": True, "jupyter_server_terminals": False}, "allow_unauthenticated_access": False},
        "Workbench": {"db": str(held_db), "hands": {"pool_size": 0}},
    }


async def test_the_api_says_the_database_is_held(wb, held_db):
    for method, path in [("GET", ("status",)), ("GET", ("sessions",)), ("POST", ("sessions",))]:
        code, data = await wb.call(method, *path, body={} if method == "POST" else None)
        assert code == 503, (path, code, data)
        assert "in use by another process" in data["error"] and str(held_db) in data["error"]
