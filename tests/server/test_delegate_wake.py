"""A parent delegating to four children in a real `jupyter server`: one child's kernel is killed, then the
server itself (SIGKILL). A new server on the same database resumes the parent, which re-attaches to its
children: every child is answered exactly once, none that had finished runs again, the tree is intact, and
every child's check runs on the workspace it kept across the kill."""

from __future__ import annotations

import json
import os
import signal
import time

from workbench.client import WorkbenchClient

LOCAL_HANDS = {"WORKBENCH_HANDS_BACKEND": "local"}


def worker(code: str) -> dict:
    # every child writes a file first, and its check reads it from a copy of the child's workspace
    return {"prompt": f"```python\nopen('mark.txt', 'w').write('ok')\n{code}\n```", "model": "scripted:worker",
            "check": "assert open('mark.txt').read() == 'ok'\nprint('mark ok')"}


def answered_once(events: list[dict]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    uses = [b["id"] for e in events if e["type"] == "assistant_turn" for b in e["payload"]["message"]["content"] if b["type"] == "tool_use"]
    answered = [e["payload"]["tool_use_id"] for e in events if e["type"] == "tool_result"]
    assert sorted(uses) == sorted(answered) and len(set(answered)) == len(answered)
    types = [e["type"] for e in events]
    assert types.count("user_message") == types.count("turn_ended") == 1
    after = types[types.index("turn_ended") + 1:]  # a child is checked, then its kernel stopped, after its turn
    assert set(after) <= {"delegate_checked", "hands_stopped"}, after


def until(what, pred, deadline: float = 120.0, every: float = 0.2):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = what()
        if pred(value):
            return value
        time.sleep(every)
    if isinstance(value, list) and value and isinstance(value[0], dict) and "type" in value[0]:
        value = [(e["type"], str(e["payload"])[:200] if e["type"] in ("delegate_checked", "tool_result") else "") for e in value]
    raise AssertionError(f"timed out waiting; last value: {str(value)[-3000:]}")


def ended(c: WorkbenchClient, sid: str) -> bool:
    return c.session(sid)["state"] == "ended" and not c.session(sid)["running"]


def test_children_survive_a_killed_kernel_and_a_killed_server(server_process, tmp_path):
    first = server_process(env=LOCAL_HANDS)
    c = WorkbenchClient(first.url, first.token)
    tasks = [worker("import time; time.sleep(1); print('quick')")] + [worker("import time; time.sleep(600)")] * 3
    parent = c.create_session(model="scripted:delegate", tools=["python", "delegate"], title="parent")["id"]
    c.send(parent, "```json\n" + json.dumps({"tasks": tasks}) + "\n```")

    kids = until(lambda: c.children(parent), lambda ks: len(ks) == 4)
    ids = [k["id"] for k in kids]
    by_index = {c.events(k)[0]["payload"]["origin"]["index"]: k for k in ids}
    quick, doomed, slow = by_index[0], by_index[1], [by_index[2], by_index[3]]
    until(lambda: quick, lambda k: ended(c, k))
    # checked, then its kernel stopped: the child is done with
    quick_events = until(lambda: c.events(quick), lambda evs: evs[-1]["type"] == "hands_stopped")
    for k in (doomed, *slow):  # every slow child is inside its long call
        until(lambda k=k: c.events(k), lambda evs: any(e["type"] == "tool_started" for e in evs))
    pid = until(lambda: c.hands(doomed).get("pid"), bool)
    os.kill(pid, signal.SIGKILL)
    until(lambda: doomed, lambda k: ended(c, k))  # its kernel's death was an observation: it answered
    until(lambda: c.events(doomed), lambda evs: evs[-1]["type"] == "delegate_checked")  # (no kernel left to stop)
    assert c.session(parent)["running"]

    first.kill()  # the server dies with the parent's delegate call and two children in flight
    second = server_process(env=LOCAL_HANDS)
    c2 = WorkbenchClient(second.url, second.token)
    until(lambda: parent, lambda p: ended(c2, p), deadline=180)

    events = c2.events(parent)
    answered_once(events)
    assert [e["type"] for e in events].count("resumed") == 1
    (result,) = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert not result["is_error"] and [ch["session_id"] for ch in result["children"]] == [quick, doomed, *slow]
    texts = result["content"]
    assert len(texts) == 4 and all(f"session {k}" in t["text"] for k, t in zip([quick, doomed, *slow], texts, strict=True))
    assert result["children"][0]["answer"] == "Final answer: quick"
    assert result["children"][1]["kernel_deaths"] == 1
    checks = [ch["check"] for ch in result["children"]]
    # a kernel death keeps the workspace, and so does a server kill: the children cut off by it wrote their
    # mark before the kill, and their checks, run by the new server, find it in the workspace each kept
    assert [ch["passed"] for ch in checks] == [True, True, True, True], checks
    assert not any("did not survive" in ch["explanation"] for ch in checks)
    kept = tmp_path / "wb.duckdb.delegate"  # each child's kept workspace is deleted once its check has run
    assert kept.is_dir() and list(kept.iterdir()) == []
    for k in ids:  # each child was checked once: the verdicts from before the kill were read, not made again
        assert [e["type"] for e in c2.events(k)].count("delegate_checked") == 1
    for k in slow:
        ks = c2.events(k)
        answered_once(ks)
        assert [e["type"] for e in ks].count("resumed") == 1
        (cut,) = [e["payload"] for e in ks if e["type"] == "tool_result"]
        assert "state unknown" in cut["content"][0]["text"]  # its cut-off call was not run again
    assert c2.events(quick) == quick_events  # the finished child did not run again
    for k in (quick, doomed):
        answered_once(c2.events(k))
    assert sorted(s["id"] for s in c2.children(parent)) == sorted(ids)  # the tree is intact
    assert all(s["parent_id"] == parent and s["kind"] == "delegate" for s in c2.children(parent))
    assert c2.status()["sessions_running"] == 0
