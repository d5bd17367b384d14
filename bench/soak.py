"""A long soak of the API: the fuzzer and fault injection of tests/server, for minutes or hours.

    python -m bench.soak --minutes 30             # from the repository root
    python -m bench.soak --minutes 5 --seed 42    # repeat a run

Cycles until the time is up: start a real `jupyter server` on one database, send it fuzz traffic
(tests/server/wbfuzz.py: every route, valid and hostile requests) for a random while, then end it
at a random moment: by SIGKILL (most often), by SIGTERM with the traffic still flowing, or by SIGTERM
once the traffic has stopped.
After each cycle the database is checked (seqs, turns, tool calls); at the end a last server
resumes what the kills cut off, and the log must have no open turn and no inconsistency.

It reports requests, statuses, routes, kills and shutdowns, and every bad answer (a 5xx, an error
that is not JSON, no answer from a server that was not being stopped) and every inconsistency, with
the seed and request number that reproduce it. The exit status is 1 when there is any. Not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests" / "server"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10)")
    p.add_argument("--seed", type=int, default=None, help="the seed (default: a new one, printed)")
    p.add_argument("--workers", type=int, default=4, help="connections sending requests at once (default 4)")
    p.add_argument("--cycle", type=float, default=30.0, help="the longest a server lives, in seconds (default 30)")
    p.add_argument("--dir", default=None, help="where the database and server logs go (default: a temp dir, kept)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(TESTS))  # the fuzzer and the server process helper live with the tests
    from wbfuzz import Pool, Tally, check_db, check_log, first_traceback, run, seed_memories, terminate, wait_idle
    from wbsrv import ServerProcess

    from workbench.client import WorkbenchClient

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**9)
    rng = random.Random(seed)
    root = Path(args.dir or tempfile.mkdtemp(prefix="wb-soak-"))
    db = root / "wb.duckdb"
    pool = Pool(memories=seed_memories(db))
    total, problems, endings = Tally(), [], {"kill": 0, "sigterm": 0, "quiet sigterm": 0}
    print(f"soak: seed {seed}, {args.minutes:g} min, {args.workers} workers, in {root}")
    started = time.monotonic()
    deadline = started + args.minutes * 60
    cycle = 0

    def report_cycle(server: ServerProcess, tally: Tally, how: str) -> None:
        trace = first_traceback(server.log_tail(50_000_000))
        if trace:
            problems.append(f"cycle {cycle} ({how}): a traceback in the server's output:\n{trace}")
        problems.extend(f"cycle {cycle} ({how}): {f}" for f in tally.failures)
        print(f"  cycle {cycle}: {how} after {tally.requests} requests ({tally.dropped} cut off); "
              f"{len(tally.failures)} bad answers")

    while time.monotonic() < deadline:
        cycle += 1
        server = ServerProcess(root / "home", db).start(timeout=120)
        life = min(rng.uniform(2.0, args.cycle), max(1.0, deadline - time.monotonic()))
        how = rng.choices(("kill", "sigterm", "quiet sigterm"), weights=(6, 3, 1))[0]

        async def go() -> Tally:
            stop, stopping = asyncio.Event(), asyncio.Event()
            traffic = asyncio.ensure_future(run(
                "127.0.0.1", server.port, server.token, seed=seed, start=cycle * 10_000_000, count=10_000_000,
                pool=pool, workers=args.workers, big=rng.random() < 0.5, stop=stop, dying=how != "quiet sigterm",
                stopping=stopping))
            await asyncio.sleep(life)
            if how == "kill":
                server.kill()
                stop.set()
            elif how == "sigterm":  # the traffic goes on while it stops: 503s, then refused connections
                stopping.set()
                server.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(server.proc.wait, 120)
            else:
                stop.set()
            return await traffic

        tally = asyncio.run(go())
        try:
            if how == "quiet sigterm":
                terminate(server)
            elif how == "sigterm" and server.proc.returncode != 0:
                problems.append(f"cycle {cycle} (sigterm): the server exited with {server.proc.returncode}")
        except AssertionError as e:
            problems.append(f"cycle {cycle} ({how}): {e}")
        finally:
            server.stop()  # whatever is left in its process group
        endings[how] += 1
        total.add(tally)
        report_cycle(server, tally, how)
        bad, _ = check_db(db, cut=how == "kill")
        problems.extend(f"cycle {cycle} ({how}): {b}" for b in bad)

    # the last server finishes every cut-off turn; then nothing may be open
    server = ServerProcess(root / "home", db).start(timeout=120)
    client = WorkbenchClient(server.url, server.token)
    try:
        try:
            wait_idle(client, timeout=300)
        except AssertionError as e:
            problems.append(f"the last server: {e}")
        for s in client.sessions():
            problems.extend(check_log(s["id"], client.events(s["id"]), running=s["running"]))
            if s["state"] == "unfinished":
                problems.append(f"session {s['id']} is unfinished with nothing running it")
    finally:
        terminate(server)
    bad, counts = check_db(db)
    problems.extend(bad)

    minutes = (time.monotonic() - started) / 60
    print(f"\nsoak: {total.requests} requests in {minutes:.1f} min ({total.requests / max(minutes * 60, 1):.0f}/s), "
          f"seed {seed}")
    print(f"servers ended by: {endings}")
    print(f"statuses: {dict(sorted(total.statuses.items(), key=str))}")
    print(f"per route:\n{total.table()}")
    print(f"writes promised: {total.sessions_created} sessions, {total.messages_accepted} messages; "
          f"{total.dropped} requests cut off by kills or shutdowns")
    print(f"log: {counts}")
    if problems:
        print(f"\n{len(problems)} problems:")
        for line in problems[:50]:
            print(line)
        return 1
    print("no bad answer, no inconsistency")
    return 0


if __name__ == "__main__":
    sys.exit(main())
