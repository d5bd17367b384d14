"""A host imports what its first request needs when it needs it: starting one, and resuming a cut-off turn of the
scripted model, imports neither the Anthropic SDK nor detect-secrets (each takes seconds of a loaded machine); nor
does making a Claude model that is sent nothing (the CLI's resume of a session with nothing to finish); nor do the
CLI's listings (sessions, models without a key, memories) import what only later work needs."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

SCRIPT = """
import asyncio, sys
from workbench.host import Host
from workbench.log import DuckDBLog

db = sys.argv[1]
with DuckDBLog(db) as log:
    log.create_session("cut", title=None, model="scripted", payload={"model": "scripted", "system": "", "tools": [],
                                                                      "max_tokens": 100})
    log.append("cut", "user_message", {"text": "hello"})

async def main():
    async with Host.open(db, hands=False) as host:
        assert await host.brain.resume("cut") == "end_turn"
    print(sorted(m for m in ("anthropic", "detect_secrets") if m in sys.modules))

asyncio.run(main())
"""


def test_starting_a_host_and_resuming_a_scripted_turn_imports_no_sdk_nor_secret_scanner(tmp_path):
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "wb.duckdb")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


CLAUDE = """
import asyncio, sys
from workbench.host import Host
from workbench.log import DuckDBLog

db = sys.argv[1]
with DuckDBLog(db) as log:
    log.create_session("done", title=None, model="claude-opus-5-5",
                       payload={"model": "claude-opus-5-5", "system": "", "tools": [], "max_tokens": 100})

async def main():
    async with Host.open(db, hands=False) as host:
        assert await host.brain.resume("done") is None  # its model is made (a missing key is said), never asked
        host.models.make("anthropic:local")
    print(sorted(m for m in ("anthropic",) if m in sys.modules))

asyncio.run(main())
"""


def test_a_claude_model_that_is_sent_nothing_imports_no_sdk(tmp_path):
    # an address where nothing listens: no request may leave this test
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-test-not-a-real-key", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    p = subprocess.run([sys.executable, "-c", CLAUDE, str(tmp_path / "wb.duckdb")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


LISTING = """
import runpy, sys
sys.argv = ["workbench", *sys.argv[1:]]
try:
    runpy.run_module("workbench.cli", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(sorted({m.split(".")[0] for m in sys.modules} & {"pydantic", "jupyter_client", "zmq", "yaml", "anthropic", "numpy",
                                                       "scipy", "bm25s"}))
"""


def imported(*args: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """`workbench ARGS` run in a process of its own: (what it printed, which of LISTING's heavy packages it imported)."""
    p = subprocess.run([sys.executable, "-c", LISTING, *args], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    *out, heavy = p.stdout.strip().splitlines()
    return "\n".join(out), ast.literal_eval(heavy)


def test_a_listing_on_the_command_line_imports_no_checks_kernel_client_nor_yaml(tmp_path):
    """What a CLI command that reads the log needs, and no more: pydantic (the checks of what is sent), the kernel
    client and PyYAML were 0.13 s of the 0.37 s of CPU that `workbench sessions` took; they come with the first
    message, kernel and task set (a CI run starts hundreds of CLI commands)."""
    from workbench.log import DuckDBLog

    db = tmp_path / "wb.duckdb"
    with DuckDBLog(db) as log:
        log.create_session("s1", title="listed", model="scripted", payload={})
    out, heavy = imported("sessions", "--db", str(db))
    assert "listed" in out and heavy == [], (out, heavy)


def test_listing_the_models_without_a_key_imports_no_sdk(tmp_path):
    """No key, no Models API to ask: `workbench models` says which models there are without the Anthropic SDK (1.9 s
    of CPU on a 2-core CI machine; every server without a key paid it too, at its first model list)."""
    from workbench.log import DuckDBLog

    db = tmp_path / "wb.duckdb"
    DuckDBLog(db).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    out, heavy = imported("models", "--db", str(db), env=env)
    assert "scripted" in out and heavy == [], (out, heavy)


def test_listing_memories_imports_no_ranking_packages(tmp_path):
    """A listing annotates each memory's contradictions with bm25s's English stop words, not its package: numpy and
    scipy come with the first ranking of memories, not with `workbench memories`."""
    db = str(tmp_path / "wb.duckdb")
    for args in (["run", "hello there. I prefer duckdb over pandas for queries."], ["dream", "--model", "scripted:dream"]):
        p = subprocess.run([sys.executable, "-m", "workbench.cli", *args, "--db", db], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
    out, heavy = imported("memories", "--db", db)
    assert "Preference" in out and heavy == [], (out, heavy)
