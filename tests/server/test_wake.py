"""A real `jupyter server` killed with SIGKILL mid-turn, and a new one on the same database:
the turn resumes by itself and finishes; nothing is lost and nothing is duplicated."""

from __future__ import annotations

import time

import psutil

from workbench.client import WorkbenchClient
from workbench.testing import FakeMessagesAPI, Reply


# local hands: these kernels write a marker into the test's directory, which a sandbox does not mount
LOCAL_HANDS = {"WORKBENCH_HANDS_BACKEND": "local"}


def check_log(events: list[dict]) -> None:
    """Seqs 1..N, one user message, every tool_use answered exactly once, the turn ended once."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = [e["type"] for e in events]
    assert types.count("user_message") == 1 and types.count("turn_ended") == 1 and types[-1] == "turn_ended"
    uses = [b["id"] for e in events if e["type"] == "assistant_turn" for b in e["payload"]["message"]["content"] if b["type"] == "tool_use"]
    answered = [e["payload"]["tool_use_id"] for e in events if e["type"] == "tool_result"]
    assert sorted(uses) == sorted(answered) and len(set(answered)) == len(answered)


def wait_for(stream, pred) -> dict:
    for msg in stream:
        if msg["kind"] == "event" and pred(msg["event"]):
            return msg["event"]
    raise AssertionError("the stream ended first")


def test_a_server_killed_mid_turn_resumes_its_turns_on_restart(server_process, tmp_path):
    """Two turns cut off by SIGKILL: one waiting for a slow model, one inside a long tool call."""
    marker = tmp_path / "ran.txt"
    long_job = f"```python\nopen({str(marker)!r}, 'a').write('x')\nimport time\ntime.sleep(600)\n```"
    with FakeMessagesAPI([Reply(text="Done, after a long think.")]) as api:
        api.delay = 600  # the model call hangs: the server dies while waiting for it
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key", **LOCAL_HANDS}
        first = server_process(env=env)
        c = WorkbenchClient(first.url, first.token)
        slow_model = c.create_session(model="claude-opus-5-5", title="slow model")["id"]
        long_tool = c.create_session(model="scripted", title="long tool call")["id"]
        with c.stream(slow_model) as stream:
            c.send(slow_model, "think hard")
            wait_for(stream, lambda e: e["type"] == "model_request")
        with c.stream(long_tool) as stream:
            c.send(long_tool, long_job)
            wait_for(stream, lambda e: e["type"] == "hands_started")
        # inside the call: its first line has run (on a loaded machine the kernel may take a while to get to it)
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert time.monotonic() < deadline, "the long call never started"
            time.sleep(0.1)
        kernel = psutil.Process(c.hands(long_tool)["pid"])
        first.kill()
        api.delay = 0

        second = server_process(env=env)  # same database, same runtime dir
        c2 = WorkbenchClient(second.url, second.token)
        for sid in (slow_model, long_tool):
            with c2.stream(sid) as stream:
                wait_for(stream, lambda e: e["type"] == "turn_ended")

        events = c2.events(slow_model)
        check_log(events)
        assert [e["type"] for e in events].count("resumed") == 1 and events[-1]["payload"]["stop_reason"] == "end_turn"
        texts = [b.get("text") for e in events if e["type"] == "assistant_turn" for b in e["payload"]["message"]["content"]]
        assert "Done, after a long think." in texts and not api.rejections

        events = c2.events(long_tool)
        check_log(events)
        result = next(e for e in events if e["type"] == "tool_result")
        assert result["payload"]["is_error"] and "state unknown" in result["payload"]["content"][0]["text"]
        assert marker.read_text() == "x"  # the cut-off call was not run again
        assert events[-1]["payload"]["stop_reason"] == "end_turn"
        assert c2.status()["sessions_running"] == 0
        kernel.wait(20)  # the dead server's orphaned kernel is gone (reaped by the new server)
