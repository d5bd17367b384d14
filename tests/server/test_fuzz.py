"""The fuzzer (wbfuzz.py) against a real server subprocess: no 5xx, every error JSON, a consistent log.

10,000 requests by default, seeded: WORKBENCH_FUZZ_SEED picks the seed (else a new one, printed),
WORKBENCH_FUZZ_REQUESTS the count. A failure names the seed and the request number, and shows the
request, so the run can be repeated and the request sent again by hand.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from wbfuzz import Pool, check_db, check_log, describe, first_traceback, run, seed_memories, terminate, wait_idle

from workbench.client import WorkbenchClient

REQUESTS = int(os.environ.get("WORKBENCH_FUZZ_REQUESTS", "10000"))


# 10,000 requests take a few minutes on a quiet machine, and three times as long under load
@pytest.mark.timeout(1200)
def test_ten_thousand_hostile_requests_get_no_5xx_and_leave_a_consistent_log(server_process, tmp_path):
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED") or random.SystemRandom().randrange(10**9))
    print(f"fuzz seed {seed} (WORKBENCH_FUZZ_SEED={seed} repeats this run)")
    db = tmp_path / "wb.duckdb"
    memories = seed_memories(db)
    # uploads must not fill the disk: a 1 MB limit, so that the few just over it stay small
    server = server_process(db, env={"WORKBENCH_FILES_MAX_UPLOAD_MB": "1"})
    client = WorkbenchClient(server.url, server.token)
    before = client.sessions()
    pool = Pool(memories=list(memories))
    tally = asyncio.run(run("127.0.0.1", server.port, server.token, seed=seed, start=0, count=REQUESTS, pool=pool,
                            upload_mb=1))
    print(f"{tally.requests} requests; statuses {dict(sorted(tally.statuses.items(), key=str))}")
    print(f"per route:\n{tally.table()}")
    print(f"2xx writes of routes the fuzzer does not understand: {len(tally.opaque)} {tally.opaque[:10]}")
    print(f"messages sent again and answered as the first: {tally.resent}; eval runs: {len(tally.eval_runs)}; "
          f"sessions that delegate: {len(pool.delegators)}")
    assert tally.requests == REQUESTS
    assert not tally.failures, f"{len(tally.failures)} bad responses (seed {seed}):\n" + "\n".join(tally.failures[:20])
    # it did both: wrote (sessions, messages) and was refused, often
    assert tally.statuses[201] > REQUESTS // 100 and tally.statuses[202] > REQUESTS // 100 and tally.statuses[400] > REQUESTS // 5

    # the log, through the API while the server runs (no turn left running)
    try:
        wait_idle(client)
    except AssertionError as e:  # a turn left open: the server's own account of it is in its log
        raise AssertionError(f"{e}\n--- the server's errors ---\n{server_errors(server)}") from None
    sessions = client.sessions()
    problems, user_messages, logs = [], {}, {}
    for s in sessions:
        events = logs[s["id"]] = client.events(s["id"])
        problems += check_log(s["id"], events, running=s["running"])
        user_messages[s["id"]] = sum(e["type"] == "user_message" for e in events)
        assert s["state"] != "unfinished", s
    # every 202'd message is the user_message at the seq its answer named (a retry's 202 named the first's)
    for sid, seq, *_ in tally.accepted:
        if sid in logs and not (0 < seq <= len(logs[sid]) and logs[sid][seq - 1]["type"] == "user_message"):
            problems.append(f"session {sid}: a message was answered 202 with seq {seq}, which is not a user_message")
    bad = list(dict.fromkeys(p.split(":")[0].split("#")[0].removeprefix("session ") for p in problems))
    assert not problems, "\n".join(problems[:20]) + "\n" + "\n".join(describe(client, s, last=60) for s in bad[:2])
    # a refused request wrote nothing: every session and user message is one the fuzzer was promised, except
    # what a 2xx of a route it does not understand (tally.opaque) named: sessions in its path may be gone or
    # changed, ids in its answer may be new sessions; nothing else
    present = {s["id"] for s in sessions}
    promised = {*pool.sessions, *pool.dreams, *(b["id"] for b in before)}
    # what runs made: eval attempts (their runs name them) and delegated children (their parent is one of ours)
    made = {r["session_id"] for run in tally.eval_runs for r in client.call("GET", f"/evals/{run}")["results"]}
    # an attempt cut off by what its model did not cause is tried again in a session of its own (docs/evals.md):
    # the results name the last try, the earlier tries' sessions say their run in their eval_started
    runs = set(tally.eval_runs)
    made |= {sid for sid, evs in logs.items()
             if any(e["type"] == "eval_started" and e["payload"].get("run") in runs for e in evs[:3])}
    ours = present | promised | tally.touched  # a parent may be gone since (a generic DELETE): its children stay
    made |= {s["id"] for s in sessions if s["kind"] == "delegate" and s.get("parent_id") in ours}
    unexpected = present - promised - tally.announced - made
    gone = promised - present
    assert not unexpected, f"sessions nobody was promised: {sorted(unexpected)[:3]}"
    assert gone <= tally.touched, f"sessions lost that no route was asked to remove: {sorted(gone - tally.touched)[:3]}"
    assert len(present & promised) == len(before) + tally.sessions_created - len(gone)
    untouched = (present & promised) - tally.touched - tally.announced - made
    # a dream's harness sends one user message per chunk it reads: at least what was promised, more with chunks;
    # a dream whose sessions hold nothing it has not read (an earlier dream read them) has no chunk and no message
    dreams = set(pool.dreams)
    empty = {s for s in dreams & set(logs)
             if any(e["type"] == "dream_ended" and e["payload"].get("chunks") == 0 for e in logs[s])}
    wrong = {s: (user_messages[s], tally.messages[s]) for s in untouched - empty
             if (user_messages[s] < tally.messages[s] if s in dreams else user_messages[s] != tally.messages[s])}
    assert not wrong, (f"user messages (in the log, promised) differ: {dict(list(wrong.items())[:5])}\n"
                       f"the 202s: {[a for a in tally.accepted if a[0] in wrong][:10]}\n"
                       + "\n".join(describe(client, s, last=60) for s in list(wrong)[:2]))
    terminate(server)
    assert not first_traceback(server.log_tail(50_000_000)), first_traceback(server.log_tail(50_000_000))

    # and in the file, after a clean stop (SIGTERM): nothing half-deleted either
    problems, counts = check_db(db, gone=gone)
    print(f"log: {counts}")
    assert not problems, "\n".join(problems[:20])
    if not tally.opaque:  # exact per session above; in all, dreams' chunks may add messages of the harness
        assert counts["user_message"] >= tally.messages_accepted
    assert "hands_started" not in counts  # the fuzz started no kernel (no ```python fence ever reached a model)
    assert counts.get("interrupted by user", 0) <= tally.interrupts_true


def server_errors(server, most: int = 12_000) -> str:
    """The server log's errors and warnings of the workbench's own (not the request lines), with what follows each."""
    lines = server.logfile.read_text(errors="replace").splitlines() if server.logfile.exists() else []
    keep: list[str] = []
    for i, line in enumerate(lines):
        if "Traceback" in line or line.startswith(("[E ", "[C ")) or ("workbench:" in line and line.startswith("[W ")):
            keep += lines[i:i + 25] + ["..."]
    return "\n".join(keep)[-most:] or "(none)"

