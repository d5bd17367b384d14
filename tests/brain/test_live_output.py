"""The live output channel on its own: coalescing, heartbeats, bounds, snapshots, redaction (no kernel)."""

from __future__ import annotations

import asyncio

import pytest

from workbench.brain import live
from workbench.brain.live import LiveOutput


@pytest.fixture(autouse=True)
def _quick(monkeypatch):
    """The same behaviour on a shorter clock: a message every 20 ms at most, a heartbeat every 0.3 s."""
    monkeypatch.setattr(live, "INTERVAL", 0.02)
    monkeypatch.setattr(live, "HEARTBEAT", 0.3)


def heard(out: LiveOutput) -> list[dict]:
    got: list[dict] = []
    out.listen(lambda sid, m: got.append({**m, "session_id": sid}))
    return got


@pytest.mark.asyncio
async def test_pieces_are_coalesced_and_a_call_ends_with_done():
    out = LiveOutput()
    got = heard(out)
    call = out.begin("s1", "t1", "python", lambda: "busy")
    for i in range(200):
        call.write("stdout", f"line {i}\n")
    await asyncio.sleep(live.INTERVAL * 3)
    assert 1 <= len(got) <= 2, "200 pieces in one interval are one message"
    assert "".join(m["text"] for m in got) == "".join(f"line {i}\n" for i in range(200))
    assert got[0]["state"] == "running" and got[0]["hands"] == "busy" and got[0]["session_id"] == "s1"
    call.write("stderr", "last\n")
    out.end(call)
    assert got[-1]["state"] == "done" and got[-1]["text"] == "last\n"
    assert [m["n"] for m in got] == list(range(1, len(got) + 1))
    assert out.snapshots("s1") == []
    n = len(got)
    call.write("stdout", "after the end\n")
    await asyncio.sleep(live.HEARTBEAT * 1.5)
    assert len(got) == n, "an ended call sends nothing more (no timer left behind)"


@pytest.mark.asyncio
async def test_a_partial_line_waits_for_its_newline_or_the_heartbeat():
    out = LiveOutput()
    got = heard(out)
    call = out.begin("s1", "t1", "python", lambda: "busy")
    call.write("stdout", "progress 10%")
    await asyncio.sleep(live.INTERVAL * 3)
    assert not any(m["text"] for m in got)
    await asyncio.sleep(live.HEARTBEAT * 1.5)
    assert "".join(m["text"] for m in got) == "progress 10%"
    assert got[-1]["elapsed_s"] >= live.HEARTBEAT * 0.8
    out.end(call)


@pytest.mark.asyncio
async def test_silence_still_sends_heartbeats_with_elapsed_time():
    out = LiveOutput()
    got = heard(out)
    call = out.begin("s1", "t1", "python", lambda: "busy")
    await asyncio.sleep(live.HEARTBEAT * 2.6)
    out.end(call)
    beats = [m for m in got if m["state"] == "running"]
    assert len(beats) >= 2 and all(m["text"] == "" for m in beats)
    assert beats[-1]["elapsed_s"] > beats[0]["elapsed_s"]


@pytest.mark.asyncio
async def test_a_flood_is_bounded_per_message_per_call_and_in_memory(monkeypatch):
    monkeypatch.setattr(live, "MAX_OUTPUT_CALL_CHARS", 100_000)
    out = LiveOutput()
    got = heard(out)
    call = out.begin("s1", "t1", "python", lambda: "busy")
    chunk = "x" * 8191 + "\n"
    for _ in range(50):  # 50 intervals of 1 MB each: 50 MB in all
        for _ in range(128):
            call.write("stdout", chunk)
        assert len(call.pending) <= live.MAX_OUTPUT_MESSAGE_CHARS and len(call.kept) <= live.MAX_OUTPUT_KEPT_CHARS
        await asyncio.sleep(live.INTERVAL * 1.2)
    out.end(call)
    assert all(len(m["text"]) <= live.MAX_OUTPUT_MESSAGE_CHARS for m in got)
    assert sum(len(m["text"]) for m in got) <= 100_000
    total = 50 * 128 * 8192
    assert sum(len(m["text"]) + m["skipped"] for m in got) == total, "every character is either sent or counted"
    assert got[-1]["over_limit"] is True


@pytest.mark.asyncio
async def test_a_snapshot_is_the_output_so_far():
    out = LiveOutput()
    got = heard(out)
    call = out.begin("s1", "t1", "python", lambda: "busy")
    call.write("stdout", "a\n")
    await asyncio.sleep(live.INTERVAL * 3)
    call.write("stdout", "b\n")
    await asyncio.sleep(live.INTERVAL * 3)
    (snap,) = out.snapshots("s1")
    assert snap["snapshot"] and snap["text"] == "a\nb\n" and snap["skipped"] == 0 and snap["n"] == got[-1]["n"]
    assert out.snapshots("other") == []
    out.end(call)


@pytest.mark.asyncio
async def test_secrets_are_masked_and_a_failing_listener_or_state_breaks_nothing():
    out = LiveOutput(redact=lambda s: s.replace("hunter2", "[secret]"))
    out.listen(lambda sid, m: 1 / 0)
    got = heard(out)

    def state() -> str:
        raise RuntimeError("no state")

    call = out.begin("s1", "t1", "python", state)
    call.write("stdout", "pw=hunt")
    call.write("stdout", "er2\n")
    out.end(call)
    assert "".join(m["text"] for m in got) == "pw=[secret]\n"
    assert got[-1]["hands"] == "unknown"
