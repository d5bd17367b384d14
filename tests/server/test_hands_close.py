"""Closing a session's hands: the REST route (with hostile input, and during a call) and `workbench close-hands`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import psutil
from wbsrv import read_until, turn_ended

from workbench.client.api import WorkbenchClient
from workbench.render import result_blocks


def gone(pid: int, within: float = 30.0) -> bool:
    """True once `pid` is no live process (a zombie awaiting its parent counts as gone)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


async def test_closing_stops_the_kernel_keeps_the_workspace_and_the_next_call_starts_again(wb):
    sid = await wb.session(model="scripted")
    ws = await wb.stream(sid)
    await wb.send(sid, "```python\nopen('note.txt', 'w').write('kept')\n```")
    await read_until(ws, turn_ended)
    _, before = await wb.call("GET", "sessions", sid, "hands", expect=200)
    assert before["pid"] and before["state"] == "idle"
    _, closed = await wb.call("POST", "sessions", sid, "hands", "close", expect=200)
    assert closed["closed"] is True and closed["state"] == "closed" and closed["pid"] is None
    assert await asyncio.to_thread(gone, before["pid"])
    stopped = await read_until(ws, lambda e: e["type"] == "hands_stopped")
    assert stopped[-1]["payload"] == {"generation": 1, "reason": "api"}
    _, again = await wb.call("POST", "sessions", sid, "hands", "close", expect=200)
    assert again["closed"] is False  # nothing left to close: still a 200
    await wb.send(sid, "```python\nprint(open('note.txt').read())\n```")
    events = await read_until(ws, turn_ended)
    result = next(e for e in events if e["type"] == "tool_result")
    assert not result["payload"]["is_error"] and "kept" in result_blocks(result["payload"])[0]["text"]
    started = next(e for e in events if e["type"] == "hands_started")
    assert started["payload"]["reason"] == "reopen after close" and started["payload"]["generation"] == 2
    ws.close()


async def test_close_route_refuses_hostile_input_with_a_clear_4xx(wb):
    sid = await wb.session(model="scripted")
    for path, body, status in [
        (("sessions", "nope", "hands", "close"), {}, 404),
        (("sessions", "x" * 5000, "hands", "close"), {}, 404),
        (("sessions", "%00%ff%fe", "hands", "close"), {}, 404),
        (("sessions", "'; DROP TABLE events; --", "hands", "close"), {}, 404),
        (("sessions", "<script>alert(1)<%2Fscript>", "hands", "close"), {}, 404),
        (("sessions", sid, "hands", "close"), {"force": True}, 400),
        (("sessions", sid, "hands", "close"), "{oops", 400),
        (("sessions", sid, "hands", "close"), b"\xff\xfe\x00", 400),
        (("sessions", sid, "hands", "close"), "[" * 10_000, 400),
    ]:
        code, data = await wb.call("POST", *path, body=body)
        assert code == status, (path, body, code, data)
        assert isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"], (path, data)
    _, events = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert [e["type"] for e in events["events"]] == ["session_created"]  # no write left behind


async def test_a_close_during_a_call_answers_the_call_and_the_turn_goes_on(wb):
    sid = await wb.session(model="scripted")
    ws = await wb.stream(sid)
    await wb.send(sid, "```python\nimport time\nprint('started', flush=True)\ntime.sleep(120)\n```")
    await read_until(ws, lambda e: e["type"] == "hands_started")  # the call is sent, or about to be
    closes = await asyncio.gather(*(wb.call("POST", "sessions", sid, "hands", "close") for _ in range(3)))
    assert all(code == 200 for code, _ in closes), closes
    assert sum(bool(data["closed"]) for _, data in closes) >= 1
    events = await read_until(ws, turn_ended)
    result = next(e for e in events if e["type"] == "tool_result")  # answered: interrupted (before or after its print)
    assert "interrupt" in result_blocks(result["payload"])[0]["text"].lower(), result
    assert events[-1]["payload"]["stop_reason"] == "end_turn"
    _, hands = await wb.call("GET", "sessions", sid, "hands", expect=200)
    assert hands["pid"] is None and hands["state"] == "closed"
    ws.close()


def test_the_cli_closes_a_sessions_hands_in_the_running_server(server_process):
    server = server_process()
    client = WorkbenchClient(server.url, server.token, timeout=120)
    try:
        sid = client.create_session(model="scripted")["id"]
        events = [m["event"] for m in client.turn(sid, "```python\nx = 1\n```", timeout=120) if m["kind"] == "event"]
        assert events[-1]["type"] == "turn_ended"
        pid = client.hands(sid)["pid"]
        assert pid
        cli = [sys.executable, "-m", "workbench", "close-hands"]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(server.home)}
        p = subprocess.run([*cli, sid, "--url", server.url, "--token", server.token], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        assert f"closed the hands of session {sid}" in p.stdout
        assert gone(pid)
        p = subprocess.run([*cli, sid, "--url", server.url, "--token", server.token, "--json"], capture_output=True,
                           text=True, timeout=120, env=env)
        assert p.returncode == 0 and json.loads(p.stdout)["closed"] is False, p.stderr
        p = subprocess.run([*cli, "nope", "--url", server.url, "--token", server.token], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 2 and p.stderr.startswith("workbench: error:") and "nope" in p.stderr, p.stderr
        p = subprocess.run([*cli, sid, "--url", server.url, "--token", "wrong"], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 2 and "refused the token" in p.stderr, p.stderr
        # the session goes on: its next call starts a kernel again
        events = [m["event"] for m in client.turn(sid, "```python\nprint(40 + 2)\n```", timeout=120) if m["kind"] == "event"]
        result = next(e for e in events if e["type"] == "tool_result")
        assert "42" in result_blocks(result["payload"])[0]["text"]
    finally:
        client.close()
