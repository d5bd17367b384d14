"""A real `jupyter server` killed with SIGKILL mid-turn, and a new one on the same database:
the turn resumes by itself and finishes; nothing is lost and nothing is duplicated."""

from __future__ import annotations

import psutil

from workbench.client import WorkbenchClient
from workbench.testing import FakeMessagesAPI, Reply


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


def test_server_killed_during_a_slow_model_call_resumes_on_restart(server_process, tmp_path):
    with FakeMessagesAPI([Reply(text="Done, after a long think.")]) as api:
        api.delay = 600  # the first call hangs: the server dies while waiting for the model
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key"}
        first = server_process(env=env)
        c = WorkbenchClient(first.url, first.token)
        sid = c.create_session(model="claude-opus-5-5", title="slow")["id"]
        with c.stream(sid) as stream:
            c.send(sid, "think hard")
            wait_for(stream, lambda e: e["type"] == "model_request")
        first.kill()
        api.delay = 0
        second = server_process(env=env)
        c2 = WorkbenchClient(second.url, second.token)
        with c2.stream(sid) as stream:
            end = wait_for(stream, lambda e: e["type"] == "turn_ended")
        assert end["payload"]["stop_reason"] == "end_turn"
        events = c2.events(sid)
        check_log(events)
        assert [e["type"] for e in events].count("resumed") == 1
        assert "Done, after a long think." in [b.get("text") for e in events if e["type"] == "assistant_turn" for b in e["payload"]["message"]["content"]]
        assert not api.rejections


def test_server_killed_during_a_tool_call_resumes_without_rerunning_it(server_process, tmp_path):
    marker = tmp_path / "ran.txt"
    steps = [
        Reply(text="Starting a long job.", code=[f"open({str(marker)!r}, 'a').write('x')\nimport time\ntime.sleep(600)"]),
        Reply(text="The job was cut off; I will not run it again blindly."),
    ]
    with FakeMessagesAPI(steps) as api:
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key"}
        first = server_process(env=env)
        c = WorkbenchClient(first.url, first.token)
        sid = c.create_session(model="claude-opus-5-5")["id"]
        with c.stream(sid) as stream:
            c.send(sid, "run the long job")
            wait_for(stream, lambda e: e["type"] == "hands_started")
        pid = c.hands(sid)["pid"]
        first.kill()
        kernel = psutil.Process(pid)
        second = server_process(env=env)
        c2 = WorkbenchClient(second.url, second.token)
        with c2.stream(sid) as stream:
            wait_for(stream, lambda e: e["type"] == "turn_ended")
        events = c2.events(sid)
        check_log(events)
        result = next(e for e in events if e["type"] == "tool_result")
        assert result["payload"]["is_error"] and "state unknown" in result["payload"]["content"][0]["text"]
        assert marker.read_text() == "x"  # the cut-off call was not run again
        assert events[-1]["payload"]["stop_reason"] == "end_turn"
        assert c2.status()["sessions_running"] == 0
        # the orphaned kernel of the dead server is gone (reaped by the new server)
        kernel.wait(20)
