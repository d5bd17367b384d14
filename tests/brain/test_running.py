""""Is this session running?" has one owner, brain/turns.py: a turn runs, or a plugin drives the session between
its turns (its `driving` hook, handed to the brain's turns by the host). Every place that asks (a session's
`running` flag, delete, a new turn or resume, a server's wake) gets the same answer from it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from workbench.brain.turns import Turns
from workbench.errors import TurnBusy
from workbench.host import Host
from workbench.log import MemoryLog
from workbench.plugins import Plugin
from workbench.service.local import Local


@dataclass
class Holding(Plugin):
    """A plugin that goes on with the sessions in `held` between their turns, as a dream's driver does."""

    held: set[str] = field(default_factory=set)

    def driving(self, session_id: str) -> bool:
        return session_id in self.held


@pytest.mark.asyncio
async def test_a_session_is_at_work_while_its_turn_runs_or_a_driver_holds_it():
    held: set[str] = set()
    turns = Turns([held.__contains__])
    go = asyncio.Event()

    def states() -> tuple[bool, bool, bool]:
        return turns.running("s"), turns.driven("s"), turns.at_work("s")

    assert states() == (False, False, False)
    held.add("s")
    assert states() == (False, True, True)  # between two turns
    turns.spawn("s", go.wait)
    assert states() == (True, False, True)  # a turn runs: running, not "between turns"
    held.discard("s")
    assert states() == (True, False, True)
    go.set()
    assert await turns.settle("s", timeout=60)
    assert states() == (False, False, False) and turns.sessions() == []


@pytest.mark.asyncio
async def test_every_check_of_the_service_asks_the_one_owner():
    plugin = Holding(name="holding")
    host = Host.build(log=MemoryLog(), hands=False, plugins=[plugin])
    wb = Local(host)
    try:
        sid = (await wb.create_session(model="scripted", tools=[]))["id"]
        host.log.append(sid, "user_message", {"text": "cut off"})  # a turn a dead process left open
        plugin.held.add(sid)
        assert host.brain.turns.at_work(sid) and not host.brain.running(sid)
        assert (await wb.session(sid))["running"] is True
        assert [s["running"] for s in (await wb.sessions())["sessions"]] == [True]
        with pytest.raises(TurnBusy, match="at work between its turns"):
            await wb.send(sid, "hello")
        with pytest.raises(TurnBusy, match="at work between its turns"):
            await wb.resume(sid)
        with pytest.raises(TurnBusy, match="interrupt it before deleting"):
            await wb.delete(sid)
        assert await wb.wake() == []  # the plugin goes on with it: the server's wake leaves it alone
        plugin.held.clear()
        assert (await wb.session(sid))["running"] is False
        assert (await wb.delete(sid))["deleted"] == sid
    finally:
        await host.close()
