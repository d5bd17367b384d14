"""Callers on an event loop hear a group commit in one callback per loop: one wake-up per group, not one per write."""

from __future__ import annotations

import asyncio
import threading

import pytest

from workbench.log import DuckDBLog, MemoryLog


@pytest.fixture(params=["duckdb", "memory"])
def log(request, tmp_path):
    lg = DuckDBLog(tmp_path / "log.duckdb") if request.param == "duckdb" else MemoryLog()
    lg.create_session("s1", title=None, model="m", payload={})
    yield lg
    lg.close()


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the callbacks other threads hand it."""

    handed = 0

    def call_soon_threadsafe(self, *args, **kw):
        CountingLoop.handed += 1
        return super().call_soon_threadsafe(*args, **kw)


def run(coro):
    loop = CountingLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_a_group_of_writes_from_one_loop_is_answered_in_one_callback_with_its_loop_subscribers(log):
    heard: list[tuple[int, list[int]]] = []

    async def main():
        loop = asyncio.get_running_loop()
        log.subscribe_commits(lambda events: heard.append((threading.get_ident(), [e.seq for e in events])), loop=loop)
        gate, inside = threading.Event(), threading.Event()
        held = log.write_soon(lambda tx: (inside.set(), gate.wait(30), tx.append("s1", "user_message", {"text": "held"}))[2])
        await asyncio.to_thread(inside.wait, 30)
        waiters = [log.write_soon(lambda tx, i=i: tx.append("s1", "user_message", {"i": i})) for i in range(20)]
        CountingLoop.handed = 0
        gate.set()
        assert (await held).seq == 2
        seqs = [(await w).seq for w in waiters]
        assert seqs == list(range(3, 23))
        assert CountingLoop.handed == 2  # the held write's group, then the group of the twenty
        assert heard[-1] == (threading.get_ident(), list(range(3, 23)))  # on the loop, before the writers heard back
        # a write from another thread (nobody waits on the loop): the loop's subscriber still hears it, on the loop
        await asyncio.to_thread(log.append, "s1", "turn_ended", {"stop_reason": "end_turn"})
        for _ in range(100):
            if heard[-1][1] == [23]:
                break
            await asyncio.sleep(0.05)
        assert heard[-1] == (threading.get_ident(), [23])

    run(main())


def test_awrite_cancelled_before_it_runs_is_not_run(log):
    async def main():
        gate, inside = threading.Event(), threading.Event()
        held = log.write_soon(lambda tx: (inside.set(), gate.wait(30), tx.append("s1", "user_message", {"text": "held"}))[2])
        await asyncio.to_thread(inside.wait, 30)
        task = asyncio.ensure_future(log.awrite(lambda tx: tx.append("s1", "user_message", {"text": "cancelled"})))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)  # the task hears its cancel (and withdraws the write) before the writer goes on
        gate.set()
        await held
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await log.aappend("s1", "user_message", {"text": "after"})).seq == 3

    run(main())
    assert [e.payload.get("text") for e in log.events("s1")][1:] == ["held", "after"]
