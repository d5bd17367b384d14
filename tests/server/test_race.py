"""Interrupts racing messages through the REST API, many times, 0-80 ms apart (a finding of the review:
a message POST answered 500 after committing its user message and left the session "unfinished" with
nothing running; an interrupt landing just after `turn_ended` appended `interrupted` and a second
`turn_ended`). The brain orders starting and interrupting per session (brain/turns.py); this checks
that the server's routes keep that promise, against the fake Messages API streaming slowly enough
for the interrupt to land before, during and after the turn.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter

from wbfuzz import check_log

MODEL = "claude-opus-5-5"
ROUNDS = 40


async def wait_idle(wb, sids: list[str]) -> list[dict]:
    for _ in range(600):
        rows = [(await wb.call("GET", "sessions", sid, expect=200))[1] for sid in sids]
        if not any(s["running"] for s in rows):
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError("turns still running after 30 s")


async def test_interrupts_racing_messages_never_5xx_and_never_leave_a_turn_open(wb, fake_api):
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED") or random.SystemRandom().randrange(10**9))
    print(f"race seed {seed}")
    rng = random.Random(seed)
    api = fake_api("default")
    api.chunk_delay = 0.004  # a turn streams for some tens of ms: long enough to be cut anywhere
    statuses: Counter = Counter()
    sids = []

    async def message(sid: str, text: str, delay: float) -> int:
        await asyncio.sleep(delay)
        code, data = await wb.call("POST", "sessions", sid, "messages", body={"text": text})
        assert code in (202, 409), (code, data)  # 409: a turn runs (or is being closed) right now
        return code

    async def interrupt(sid: str, delay: float) -> int:
        await asyncio.sleep(delay)
        code, data = await wb.call("POST", "sessions", sid, "interrupt", body={})
        assert code == 200 and isinstance(data["interrupted"], bool), (code, data)
        return code

    for i in range(ROUNDS):
        sid = await wb.session(model=MODEL, title=f"race {i}")
        sids.append(sid)
        for turn in range(2):  # the second turn races on a session whose first was cut anywhere
            gap = rng.uniform(0, 0.08)
            first_message = rng.random() < 0.75
            racers = [message(sid, f"round {i} turn {turn}", 0 if first_message else gap),
                      interrupt(sid, gap if first_message else 0)]
            if rng.random() < 0.3:  # and sometimes a second interrupt, or a second message
                racers.append(interrupt(sid, rng.uniform(0, 0.08)) if rng.random() < 0.5
                              else message(sid, f"round {i} again", rng.uniform(0, 0.08)))
            for code in await asyncio.gather(*racers):
                statuses[code] += 1

    rows = await wait_idle(wb, sids)
    problems = []
    for s in rows:
        assert s["state"] != "unfinished", s  # never stuck: nothing runs, so every turn has ended
        _, page = await wb.call("GET", "sessions", s["id"], "events", expect=200)
        problems += check_log(s["id"], page["events"])
    assert not problems, f"seed {seed}:\n" + "\n".join(problems[:20])
    # and each session takes a new message at once, to the end
    for sid in sids:
        await wb.send(sid, "still there?")
    for s in await wait_idle(wb, sids):
        _, page = await wb.call("GET", "sessions", s["id"], "events", expect=200)
        assert page["events"][-1]["type"] == "turn_ended" and page["events"][-1]["payload"]["stop_reason"] == "end_turn"
        assert not check_log(s["id"], page["events"])
    print(f"statuses {dict(statuses)}")
    assert statuses[202] > ROUNDS  # the races were real: turns started, and many were cut
