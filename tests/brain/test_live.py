"""Live output of a running call, through the brain, from a real (sandboxed) kernel, with the scripted model."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time

import pytest
from wbsupport import LOOP, WORKBENCH, cli_env, ticks

from workbench.hands import Observation
from workbench.hands.observing import result_content

pytestmark = pytest.mark.slow



@pytest.mark.asyncio
async def test_output_arrives_while_the_call_runs_and_is_never_logged(brain, log):
    sid = brain.create_session(model="scripted")["id"]
    got: list[tuple[float, dict]] = []
    brain.listen_output(lambda s, m: got.append((time.time(), m)) if s == sid else None)
    await brain.run_turn(sid, LOOP.format(n=8, dt=1))
    running = [(t, m) for t, m in got if m["state"] == "running"]
    done = [m for _, m in got if m["state"] == "done"]
    assert len(done) == 1 and done[0]["hands"] in ("idle", "busy")
    first = next((t, m) for t, m in running if "tick 0" in m["text"])
    lag = first[0] - ticks(first[1]["text"])[0]
    assert lag < 5.0, f"the first line arrived {lag:.1f} s after it was printed"
    end = got[-1][0]
    assert end - first[0] > 4.0, "the first line came well before the call ended, not with its result"
    assert all(m["hands"] == "busy" for _, m in running if m["text"]), "the hands are busy while the call runs"
    text = "".join(m["text"] for _, m in got)
    assert sorted(ticks(text)) == list(range(8))
    assert any(m["elapsed_s"] >= 7 for _, m in running) or done[0]["elapsed_s"] >= 7
    # the committed tool_result is the only record
    events = log.events(sid)
    result = next(e for e in events if e.type == "tool_result")
    assert sorted(ticks(Observation.from_json(result.payload["observation"]).stdout)) == list(range(8))
    assert {e.type for e in events} <= {"session_created", "user_message", "model_request", "assistant_turn", "tool_started",
                                        "tool_result", "turn_ended", "hands_started"}
    line0 = next(line for line in Observation.from_json(result.payload["observation"]).stdout.splitlines() if line.startswith("tick 0 "))
    assert {e.type for e in events if line0 in str(e.payload)} <= {"tool_result", "assistant_turn"}  # the model quotes it


@pytest.mark.asyncio
async def test_a_watcher_arriving_mid_call_gets_the_output_so_far(brain):
    sid = brain.create_session(model="scripted")["id"]
    turn = asyncio.ensure_future(brain.run_turn(sid, LOOP.format(n=6, dt=1)))
    deadline = time.monotonic() + 120
    snaps: list[dict] = []
    while time.monotonic() < deadline and not turn.done():
        snaps = brain.live.snapshots(sid)
        if snaps and "tick 2" in snaps[0]["text"]:
            break
        await asyncio.sleep(0.1)
    assert snaps and snaps[0]["snapshot"] and "tick 0" in snaps[0]["text"] and "tick 1" in snaps[0]["text"]
    assert snaps[0]["hands"] == "busy"
    await turn
    assert brain.live.snapshots(sid) == []


@pytest.mark.asyncio
async def test_an_interrupted_call_keeps_what_it_printed_in_the_log_and_for_the_model(brain, log):
    """Stop keeps a call's output so far, as a stopped notebook cell keeps its output (issue 25, item 2)."""
    sid = brain.create_session(model="scripted")["id"]
    turn = asyncio.ensure_future(brain.run_turn(sid, LOOP.format(n=600, dt=0.2)))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not turn.done():
        snaps = brain.live.snapshots(sid)
        if snaps and "tick 3" in snaps[0]["text"]:
            break
        await asyncio.sleep(0.1)
    assert await brain.interrupt(sid)
    with pytest.raises(asyncio.CancelledError):  # the caller waiting for the turn sees it end interrupted
        await turn
    result = next(e for e in log.events(sid) if e.type == "tool_result").payload
    assert result["interrupted"] and result["is_error"]
    printed = Observation.from_json(result["observation"]).stdout
    shown = sorted(ticks(printed))
    assert shown[:4] == [0, 1, 2, 3] and shown == list(range(len(shown))), printed
    # the model reads the same: the output so far, and that the call was interrupted there
    text = "\n".join(b["text"] for b in result_content(result))
    assert text.startswith("[interrupted after it printed:]\ntick 0 "), text
    assert text.rstrip().endswith("[interrupted by the user; the call's effect is unknown]"), text
    request = (await brain.conversation(sid)).request()
    sent = [b for m in request["messages"] if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result"]
    assert "tick 3 " in str(sent[-1]["content"]), sent[-1]


@pytest.mark.asyncio
async def test_displays_results_and_errors_are_short_notes(brain):
    sid = brain.create_session(model="scripted")["id"]
    got: list[dict] = []
    brain.listen_output(lambda s, m: got.append(m))
    code = "```python\nfrom IPython.display import display, HTML\nprint('hi')\ndisplay(HTML('<b>x</b>'))\n1 / 0\n```"
    await brain.run_turn(sid, code)
    text = "".join(m["text"] for m in got)
    assert "hi\n" in text and "[display: text/plain, text/html]" in text and "[error] ZeroDivisionError: division by zero" in text


def test_the_cli_shows_a_30_second_loop_as_it_prints(db_path):
    """`workbench run`: the loop's first lines reach the terminal within seconds of their print, long before the call ends."""
    proc = subprocess.Popen([*WORKBENCH, "run", LOOP.format(n=30, dt=1), "--model", "scripted", "--db", str(db_path)],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.time(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(line.startswith("│ tick 2 ") for _, line in lines):
            time.sleep(0.05)
        seen = {int(line.split()[2]): (t, float(line.split()[3])) for t, line in lines
                if line.startswith("│ tick ") and len(line.split()) == 4}
        assert {0, 1, 2} <= set(seen), "".join(line for _, line in lines)[-2000:]
        lags = [arrived - printed for arrived, printed in seen.values()]
        assert max(lags) < 5.0, f"lines reached the terminal {max(lags):.1f} s after their print"
        assert any(line.startswith("├─ output (live)") for _, line in lines)
    finally:
        proc.send_signal(signal.SIGINT)  # the rest of the loop is not needed: interrupt, as Ctrl-C does
        proc.wait(60)
        reader.join(10)
    assert proc.returncode == 130
