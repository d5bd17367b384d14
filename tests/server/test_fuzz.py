"""The fuzzer (wbfuzz.py) against a real server subprocess: no 5xx, every error JSON, a consistent log.

10,000 requests by default, seeded: WORKBENCH_FUZZ_SEED picks the seed (else a new one, printed),
WORKBENCH_FUZZ_REQUESTS the count. A failure names the seed and the request number, and shows the
request, so the run can be repeated and the request sent again by hand.
"""

from __future__ import annotations

import asyncio
import os
import random

from wbfuzz import Pool, check_db, check_log, first_traceback, run, seed_memories, terminate, wait_idle

from workbench.client import WorkbenchClient

REQUESTS = int(os.environ.get("WORKBENCH_FUZZ_REQUESTS", "10000"))


def test_ten_thousand_hostile_requests_get_no_5xx_and_leave_a_consistent_log(server_process, tmp_path):
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED") or random.SystemRandom().randrange(10**9))
    print(f"fuzz seed {seed} (WORKBENCH_FUZZ_SEED={seed} repeats this run)")
    db = tmp_path / "wb.duckdb"
    memories = seed_memories(db)
    server = server_process(db)
    client = WorkbenchClient(server.url, server.token)
    before = client.sessions()
    pool = Pool(memories=list(memories))
    tally = asyncio.run(run("127.0.0.1", server.port, server.token, seed=seed, start=0, count=REQUESTS, pool=pool))
    print(f"{tally.requests} requests; statuses {dict(sorted(tally.statuses.items(), key=str))}")
    print(f"routes {dict(tally.routes)}")
    assert tally.requests == REQUESTS
    assert not tally.failures, f"{len(tally.failures)} bad responses (seed {seed}):\n" + "\n".join(tally.failures[:20])
    # it did both: wrote (sessions, messages) and was refused, often
    assert tally.statuses[201] > REQUESTS // 100 and tally.statuses[202] > REQUESTS // 100 and tally.statuses[400] > REQUESTS // 5

    # the log, through the API while the server runs (no turn left running)
    wait_idle(client)
    sessions = client.sessions()
    problems = []
    for s in sessions:
        problems += check_log(s["id"], client.events(s["id"]), running=s["running"])
        assert s["state"] != "unfinished", s
    assert not problems, "\n".join(problems[:20])
    # a refused request wrote nothing: every session and user message is one the fuzzer was promised
    unexpected = [s for s in sessions if s["id"] not in {*pool.sessions, *pool.dreams, *(b["id"] for b in before)}]
    assert not unexpected and len(sessions) == len(before) + tally.sessions_created, unexpected[:3]
    terminate(server)
    assert not first_traceback(server.log_tail(50_000_000)), first_traceback(server.log_tail(50_000_000))

    # and in the file, after a clean stop (SIGTERM)
    problems, counts = check_db(db)
    print(f"log: {counts}")
    assert not problems, "\n".join(problems[:20])
    assert counts["user_message"] == tally.messages_accepted
    assert "hands_started" not in counts  # the fuzz started no kernel (no ```python fence ever reached a model)
    assert counts.get("interrupted by user", 0) <= tally.interrupts_true
