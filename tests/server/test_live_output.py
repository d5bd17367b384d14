"""Live output over the websocket: `output` messages while a call runs, a snapshot on reconnect, floods bounded."""

from __future__ import annotations

import json
import threading
import time

import psutil
from wbsrv import read_until, turn_ended
from wbsupport import LOOP, ticks

from workbench.brain import live
from workbench.client import WorkbenchClient



async def read_output_until(ws, stop) -> list[tuple[float, dict]]:
    """(arrival time, message) of every message until stop(message)."""
    got = []
    while True:
        raw = await ws.read_message()
        assert raw is not None, "the stream closed early"
        msg = json.loads(raw)
        got.append((time.time(), msg))
        if stop(msg):
            return got


def is_result(msg: dict) -> bool:
    return msg["kind"] == "event" and msg["event"]["type"] == "tool_result"


async def test_output_streams_while_the_call_runs_then_the_result_is_the_record(wb):
    sid = await wb.session(model="scripted")
    ws = await wb.stream(sid)
    await wb.send(sid, LOOP.format(n=8, dt=1))
    busy: list[str] = []
    got = await read_output_until(ws, lambda m: m["kind"] == "output" and "tick 0" in m["text"])
    arrived, first = got[-1]
    _, hands = await wb.call("GET", "sessions", sid, "hands", expect=200)
    busy.append(hands["state"])
    got += await read_output_until(ws, is_result)
    end = got[-1][0]
    lag = arrived - ticks(first["text"])[0]
    assert lag < 5.0, f"the first line reached the websocket {lag:.1f} s after it was printed"
    assert end - arrived > 4.0, "the first line came well before the call ended"
    assert busy == ["busy"], "the hands say busy while the call runs"
    outputs = [m for _, m in got if m["kind"] == "output"]
    assert all(m["session_id"] == sid and m["name"] == "python" and not m["snapshot"] for m in outputs)
    assert [m["n"] for m in outputs] == list(range(1, len(outputs) + 1))
    assert outputs[-1]["state"] == "done" and all(m["state"] == "running" for m in outputs[:-1])
    assert all(m["hands"] == "busy" for m in outputs[:-1] if m["text"])
    assert sorted(ticks("".join(m["text"] for m in outputs))) == list(range(8))
    assert outputs[-1]["elapsed_s"] >= 7
    # coalesced: a message per line or heartbeat, not per byte
    assert len(outputs) < 40
    result = got[-1][1]["event"]
    assert result["payload"]["tool_use_id"] == outputs[0]["tool_use_id"]
    await read_until(ws, turn_ended)
    ws.close()
    # nothing of it is stored but the result
    _, page = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert "output" not in {e["type"] for e in page["events"]}
    _, hands = await wb.call("GET", "sessions", sid, "hands", expect=200)
    assert hands["state"] == "idle"


async def test_a_client_that_connects_mid_call_sees_the_output_so_far(wb):
    sid = await wb.session(model="scripted")
    ws = await wb.stream(sid)
    await wb.send(sid, LOOP.format(n=7, dt=1))
    seen = await read_output_until(ws, lambda m: m["kind"] == "output" and "tick 2" in m["text"])
    last_seq = max(m["event"]["seq"] for _, m in seen if m["kind"] == "event")
    ws.close()
    ws2 = await wb.stream(sid, after=last_seq)
    got = [m for _, m in await read_output_until(ws2, is_result)]
    outputs = [m for m in got if m["kind"] == "output"]
    snap = outputs[0]
    assert snap["snapshot"] and snap["state"] == "running" and snap["hands"] == "busy" and snap["skipped"] == 0
    assert {0, 1, 2} <= set(ticks(snap["text"]))
    rest = outputs[1:]
    assert all(m["n"] > snap["n"] and not m["snapshot"] for m in rest), "nothing twice after the snapshot"
    assert sorted(ticks(snap["text"] + "".join(m["text"] for m in rest))) == list(range(7))
    assert rest[-1]["state"] == "done"
    # a client arriving after the call gets the committed result, and no live output
    ws3 = await wb.stream(sid, after=0)
    after = [json.loads(await ws3.read_message()) for _ in range(5)]
    assert all(m["kind"] == "event" for m in after)
    await read_until(ws2, turn_ended)
    ws2.close()
    ws3.close()


FLOOD = (
    "```python\nimport sys, time\n"
    "write = type(sys.stdout).write  # past the in-kernel cap, as hostile code can\n"
    "chunk = 'x' * 1023 + '\\n'\n"
    "for i in range(50 * 1024):\n    write(sys.stdout, chunk)\n"
    "    if i % 256 == 0:\n        sys.stdout.flush()  # messages the hands read (one of 50 MB would be dropped whole)\n"
    "    if i % 1024 == 0:\n        time.sleep(0.05)  # 50 bursts of 1 MB over a few seconds\n"
    "sys.stdout.flush()\nprint('flood done', flush=True)\n```"
)


def test_a_50_mb_flood_keeps_the_server_small_and_the_websocket_bounded(server_process, tmp_path):
    server = server_process(env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    c = WorkbenchClient(server.url, server.token)
    sid = c.create_session(title="flood")["id"]
    c.ask("```python\nprint('warm')\n```", session=sid)  # the kernel is up: its start is not counted
    proc = psutil.Process(server.proc.pid)
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    outputs, wire = [], 0
    try:
        with c.stream(sid, after=c.session(sid)["last_seq"], timeout=300) as stream:
            c.send(sid, FLOOD)
            for msg in stream:
                if msg["kind"] == "output":
                    outputs.append(msg)
                    wire += len(json.dumps(msg))
                elif msg["kind"] == "event" and msg["event"]["type"] == "turn_ended":
                    break
    finally:
        done.set()
        sampler.join()
    flood = 50 * 1024 * 1024
    sent = sum(len(m["text"]) for m in outputs)
    skipped = sum(m["skipped"] for m in outputs)
    assert all(len(m["text"]) <= live.MAX_OUTPUT_MESSAGE_CHARS for m in outputs)
    assert sent <= live.MAX_OUTPUT_CALL_CHARS and wire < 2 * live.MAX_OUTPUT_CALL_CHARS, "the websocket carried a bounded amount"
    assert skipped > flood // 2, "the messages say how much was left out"
    assert sent + skipped >= flood
    assert len(outputs) >= 10, "a flood over seconds still comes as messages while it runs"
    growth = (peak[0] - base) / 2**20
    print(f"server RSS {base / 2**20:.0f} MiB, peak growth {growth:.0f} MiB; {len(outputs)} messages, {wire / 2**20:.1f} MiB on the wire")
    assert growth < 100, f"the server grew by {growth:.0f} MiB for a 50 MiB flood"
    assert c.hands(sid)["state"] == "idle"


def test_an_agent_cell_shows_a_30_second_loop_as_it_prints(server_process, tmp_path):
    """`%%agent` in a real kernel: the call's widget shows each line within seconds of its print, long before the call ends."""
    import re

    from jupyter_client.manager import start_new_kernel

    server = server_process(env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        kc.execute_interactive("%load_ext workbench", timeout=60)
        kc.execute(f"%%agent --url {server.url} --token {server.token} --title loop\n" + LOOP.format(n=30, dt=1))
        seen: dict[int, tuple[float, float]] = {}
        states: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not {0, 1, 2} <= set(seen):
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:  # queue.Empty: nothing this second
                continue
            if msg["msg_type"] not in ("comm_msg", "comm_open"):
                continue
            now, raw = time.time(), json.dumps(msg["content"])
            for i, t in re.findall(r"tick (\d+) (\d+\.\d+)", raw):
                seen.setdefault(int(i), (now, float(t)))
            states.update(re.findall(r"running \\u00b7 \d+ s \\u00b7 hands (\w+)", raw))
        assert {0, 1, 2} <= set(seen), f"the cell showed {sorted(seen)}"
        lags = [arrived - printed for arrived, printed in seen.values()]
        assert max(lags) < 5.0, f"lines reached the cell {max(lags):.1f} s after their print"
        assert "busy" in states, states
        km.interrupt_kernel()  # the stop button: interrupts the turn; the rest of the loop is not needed
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        c = WorkbenchClient(server.url, server.token)
        sid = next(s["id"] for s in c.sessions() if s["title"] == "loop")
        assert c.events(sid)[-1]["payload"].get("stop_reason") == "interrupted"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
