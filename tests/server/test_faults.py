"""Fault injection: a real server SIGKILLed at random moments while fuzz traffic (sessions created,
messages sent, turns interrupted, dreams started, hostile requests) is in flight, restarted on the same
database each time. Whatever a kill cuts, the log stays consistent, and the next server finishes every
cut-off turn: seqs contiguous, one turn_ended per turn, every tool call answered exactly once, no
session left unfinished once nothing runs.

WORKBENCH_FUZZ_SEED repeats a run (the kill moments come from the seed too).
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from wbfuzz import Pool, Tally, check_db, check_log, describe, first_traceback, run, seed_memories, terminate, wait_idle

from workbench.client import WorkbenchClient

KILLS = 5


@pytest.mark.timeout(1200)  # up to 20 servers started and killed, and a last one, on a loaded machine
def test_a_server_killed_at_random_moments_leaves_a_log_the_next_one_finishes(server_process, tmp_path):
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED") or random.SystemRandom().randrange(10**9))
    print(f"fault seed {seed}")
    rng = random.Random(seed)
    db = tmp_path / "wb.duckdb"
    pool = Pool(memories=seed_memories(db))
    total = Tally()
    kill = 0

    def enough() -> bool:  # traffic enough to judge: on a loaded machine a server may serve little before its kill
        return total.requests > 200 and total.sessions_created > 5 and total.messages_accepted > 5

    while kill < KILLS or (not enough() and kill < 4 * KILLS):
        server = server_process(db)
        after = rng.uniform(0.3, 3.0)

        async def go() -> Tally:
            stop, tally = asyncio.Event(), Tally()
            traffic = asyncio.ensure_future(run("127.0.0.1", server.port, server.token, seed=seed, start=kill * 1_000_000,
                                                count=1_000_000, pool=pool, big=False, stop=stop, dying=True, tally=tally))
            for _ in range(600):  # the moment is random from the first answer: a loaded server may take seconds to it
                if tally.requests or traffic.done():
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(after)
            server.kill()  # SIGKILL, mid-whatever
            stop.set()
            return await traffic

        tally = asyncio.run(go())
        total.add(tally)
        print(f"kill {kill + 1} after {after:.2f} s: {tally.requests} requests, {tally.dropped} cut off")
        assert not tally.failures, f"seed {seed}:\n" + "\n".join(tally.failures[:10])
        assert not first_traceback(server.log_tail(50_000_000)), first_traceback(server.log_tail(50_000_000))
        kill += 1
    assert enough(), f"{kill} kills and still little traffic: {total.requests} requests, {total.sessions_created} sessions"

    # the next server resumes what the kills cut off, and the log is whole
    server = server_process(db)
    client = WorkbenchClient(server.url, server.token)
    wait_idle(client)
    problems = []
    for s in client.sessions():
        problems += check_log(s["id"], client.events(s["id"]), running=s["running"])
        if s["state"] == "unfinished":
            problems.append(f"session {s['id']} is unfinished and nothing runs it")
    bad = list(dict.fromkeys(p.split(":")[0].removeprefix("session ") for p in problems))
    assert not problems, f"seed {seed}:\n" + "\n".join(problems[:20]) + "\n" + "\n".join(describe(client, s) for s in bad[:2])
    terminate(server)
    assert not first_traceback(server.log_tail(50_000_000)), first_traceback(server.log_tail(50_000_000))
    problems, counts = check_db(db)
    print(f"log after {kill} kills: {counts}")
    assert not problems, f"seed {seed}:\n" + "\n".join(problems[:20])
    # a kill may cut a request after its commit, never lose one (only a route asked to remove a session may)
    assert counts["sessions"] >= total.sessions_created - len(total.touched)
