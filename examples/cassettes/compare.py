"""Two models on three small tasks, replayed offline from the cassette next to this file.

    python examples/cassettes/compare.py            # replay compare.jsonl: no key, no network
    python examples/cassettes/compare.py --record   # record it again against the fake Messages API

`anthropic:fake-careful` computes each answer in its kernel; `anthropic:fake-hasty`
answers from its head and gets one wrong. Both are the fake Messages API of
`workbench.testing` answering from `script` below (with a fixed signing key, so
that recording again gives the same file byte for byte while nothing the
requests depend on has changed: the default system prompt, the tools, the
kernel's output). Import this file to use `TASKS`, `MODELS`, `script` and
`run_all(host)` in a notebook or an eval of your own.
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
CASSETTE = HERE / "compare.jsonl"
MODELS = ("anthropic:fake-careful", "anthropic:fake-hasty")
SIGNING_KEY = b"workbench-example-cassette"  # the fake API's key: only makes re-recording repeatable

TASKS: list[dict[str, Any]] = [
    {"name": "mean", "prompt": "What is the mean of 3, 1, 4, 1, 5, 9, 2, 6? Reply with the number.",
     "answer": "3.875", "code": "print(sum([3, 1, 4, 1, 5, 9, 2, 6]) / 8)", "guess": "4"},
    {"name": "primes", "prompt": "How many prime numbers are there below 100?",
     "answer": "25", "code": "print(sum(all(n % d for d in range(2, n)) for n in range(2, 100)))", "guess": "25"},
    {"name": "words", "prompt": "How many words are in 'the quick brown fox jumps over the lazy dog'?",
     "answer": "9", "code": "print(len('the quick brown fox jumps over the lazy dog'.split()))", "guess": "8"},
]


def script(request: dict[str, Any]) -> Reply:
    """The fake API's answers: careful computes in the kernel, hasty guesses."""
    first = request["messages"][0]["content"][0]["text"]
    task = next((t for t in TASKS if t["prompt"] == first), None)
    if task is None:
        return Reply(text="I only know the example tasks of examples/cassettes/compare.py.")
    if request["model"].endswith("careful"):
        results = [b for b in request["messages"][-1]["content"] if b.get("type") == "tool_result"]
        if not results:
            return Reply(thinking="I will compute it rather than guess.", text="Let me compute it.", code=[task["code"]])
        return Reply(thinking="", text=f"The answer is {results[0]['content'][0]['text'].strip()}.")
    return Reply(thinking="This is easy enough to do in my head.", text=f"The answer is {task['guess']}.")


async def run_all(host: Host) -> list[dict[str, Any]]:
    """Every task with every model, one session each, in order; a row per attempt."""
    rows = []
    for task in TASKS:
        for model in MODELS:
            sid = host.brain.create_session(model=model, title=f"{task['name']} / {model}")["id"]
            stop = await host.brain.run_turn(sid, task["prompt"])
            events = host.log.events(sid)
            turns = [e.payload for e in events if e.type == "assistant_turn"]
            final = "".join(b.get("text", "") for b in turns[-1]["message"]["content"] if b["type"] == "text") if turns else ""
            rows.append({
                "task": task["name"], "model": model, "stop": stop, "answer": final,
                "passed": f"The answer is {task['answer']}." == final,
                "model_calls": len(turns), "tool_calls": sum(e.type == "tool_started" for e in events),
                "input_tokens": sum(t["usage"]["input_tokens"] for t in turns),
                "output_tokens": sum(t["usage"]["output_tokens"] for t in turns), "session": sid,
            })
    return rows


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true", help="record the cassette again against the fake Messages API")
    p.add_argument("--cassette", default=str(CASSETTE), help="the cassette file (default: compare.jsonl next to this file)")
    args = p.parse_args(argv)
    api = None
    if args.record:
        api = FakeMessagesAPI(script, key=SIGNING_KEY).start()
        os.environ.update(ANTHROPIC_API_KEY="sk-fake-not-a-real-key", ANTHROPIC_BASE_URL=api.url)
    settings = HostSettings(cassette=args.cassette, cassette_mode="record" if args.record else "replay")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with Host.open(Path(tmp) / "log.duckdb", settings=settings) as host:
                rows = await run_all(host)
    finally:
        if api is not None:
            api.stop()
    for r in rows:
        print(f"{r['task']:8} {r['model']:24} {'pass' if r['passed'] else 'FAIL'}  {r['answer']}")
    return 0 if all(r["stop"] == "end_turn" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
