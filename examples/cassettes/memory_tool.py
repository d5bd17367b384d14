"""A session that keeps a note with Claude's memory tool, replayed offline from the cassette next to this file.

    python examples/cassettes/memory_tool.py            # replay memory_tool.jsonl: no key, no network
    python examples/cassettes/memory_tool.py --record   # record it again against the fake Messages API

`anthropic:fake-memory` is the fake Messages API of `workbench.testing` answering from `script` below: it
looks in /memories, writes a note, corrects it, and reads it back, with the memory tool
(`memory_20250818`) that the workbench serves from its memory stores. The tool runs for real when the
cassette replays: the note becomes a proposal of the session (actor `agent:<session id>`) in the store
`default`, for a person to review (docs/memory.md, "The memory tool"). The fake API signs with a fixed key,
so recording again gives the same file byte for byte while nothing the requests depend on has changed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from workbench.host import Host, HostSettings
from workbench.testing import FakeMessagesAPI, Reply

HERE = Path(__file__).resolve().parent
CASSETTE = HERE / "memory_tool.jsonl"
MODEL = "anthropic:fake-memory"
SIGNING_KEY = b"workbench-example-cassette"  # the fake API's key: only makes re-recording repeatable
PROMPT = "Remember how we run the tests here: the fast tier first, with pytest -m 'not slow'."
NOTE = "/memories/default/testing.md"
STEPS = [
    Reply(thinking="Check my memory directory before anything else.", text="Let me look at my memory first.",
          tool_calls=[("memory", {"command": "view", "path": "/memories"})]),
    Reply(text="Nothing about testing yet; I'll write it down.",
          tool_calls=[("memory", {"command": "create", "path": NOTE,
                                  "file_text": "Run the fast tier first: pytest -m 'not slow'.\n"})]),
    Reply(text="Adding how long it takes.",
          tool_calls=[("memory", {"command": "str_replace", "path": NOTE, "old_str": "fast tier first",
                                  "new_str": "fast tier first (about a minute and a half)"})]),
    Reply(tool_calls=[("memory", {"command": "view", "path": NOTE})]),
    Reply(text=f"Noted in {NOTE}; a person reviews it before other sessions are told."),
]


def script(request: dict[str, Any]) -> Reply:
    """The fake API's answers: the n-th call of the session gets the n-th step."""
    n = sum(1 for m in request["messages"] if m["role"] == "assistant")
    return STEPS[min(n, len(STEPS) - 1)]


async def run(host: Host) -> str:
    """The session, with the memory tool only; its id."""
    sid = host.brain.create_session(model=MODEL, title="keep a note", tools=["memory"])["id"]
    stop = await host.brain.run_turn(sid, PROMPT)
    if stop != "end_turn":
        raise RuntimeError(f"the session stopped with {stop}")
    return sid


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true", help="record the cassette again against the fake Messages API")
    p.add_argument("--cassette", default=str(CASSETTE), help="the cassette file (default: memory_tool.jsonl here)")
    args = p.parse_args(argv)
    api = None
    if args.record:
        api = FakeMessagesAPI(script, key=SIGNING_KEY).start()
        os.environ.update(ANTHROPIC_API_KEY="sk-fake-not-a-real-key", ANTHROPIC_BASE_URL=api.url)
    settings = HostSettings(cassette=args.cassette, cassette_mode="record" if args.record else "replay")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with Host.open(Path(tmp) / "log.duckdb", settings=settings) as host:
                sid = await run(host)
                for m in host.plugin("memory").store.list():
                    print(f"{m['id']}  {m['status']}  {m['title']}  by {m['created_by']}: {m['text']}")
                print(f"session {sid}")
    finally:
        if api is not None:
            api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
