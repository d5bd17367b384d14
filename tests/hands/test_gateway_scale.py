"""The gateway backend at scale: a dead kernel noticed by the hands' probe (not the gateway's restarter),
a busy cell never taken for dead, the limits a kernel can set on itself, and the warm pool; each against a
Jupyter Kernel Gateway and a Jupyter Enterprise Gateway (the same tests, the gateway a parameter)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from workbench.hands.factory import HandsFactory, HandsSettings

from .conftest import DEAF_GATEWAYS, GATEWAYS

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=list(GATEWAYS))
def any_gateway(request):
    """Each kind of gateway, running, its restarter quick to notice a death."""
    return request.getfixturevalue(GATEWAYS[request.param])


@pytest.fixture(params=list(DEAF_GATEWAYS))
def any_deaf_gateway(request):
    """Each kind of gateway, running, its restarter 10 minutes from noticing a death."""
    return request.getfixturevalue(DEAF_GATEWAYS[request.param])


def settings(gw, tmp_path, **kw) -> HandsSettings:
    return HandsSettings(backend="gateway", gateway_url=gw.url, gateway_token=gw.token,
                         registry_dir=str(tmp_path / "registry"), **{"pool_size": 0, **kw})


async def test_the_probe_notices_a_dead_kernel_the_restarter_does_not(any_deaf_gateway, tmp_path, recorder):
    events, sink = recorder
    async with HandsFactory(settings(any_deaf_gateway, tmp_path, gateway_probe=1.0)) as factory:
        hands = factory("probe", {"hands": {"startup_timeout": 60}}, sink)
        assert (await hands.execute("x = 1")).ok
        kernel = hands.kernel
        os.kill(any_deaf_gateway.kernel_pid(hands.status()["kernel_id"]), signal.SIGKILL)
        deadline = time.monotonic() + 120  # generous for a loaded machine; the restarter would take 600 s
        while await kernel.death() is None:
            assert time.monotonic() < deadline, "the probe did not notice the dead kernel"
            await asyncio.sleep(0.05)
        assert "answered nothing" in (await kernel.death()).how
        obs = await hands.execute("1+1", timeout=60)
        assert obs.result == "2" and "died between calls" in obs.text(), obs.text()
        died = [p for t, p in events if t == "hands_died"]
        assert len(died) == 1 and died[0]["during"] == "idle" and "answered nothing" in died[0]["how"]


async def test_a_cell_holding_the_gil_is_not_taken_for_dead(any_gateway, tmp_path):
    async with HandsFactory(settings(any_gateway, tmp_path, gateway_probe=0.5)) as factory:
        hands = factory("gil", {"hands": {"startup_timeout": 60}}, None)
        # catastrophic backtracking: the regex engine holds the GIL for seconds, so the control thread cannot answer
        code = "import re, time\nt = time.monotonic()\nre.match('(a*)*b', 'a' * 26)\nprint(time.monotonic() - t > 1.0)"
        obs = await hands.execute(code, timeout=300)
        assert obs.ok and obs.stdout.strip() == "True", obs.text()
        assert hands.status()["generation"] == 1


async def test_the_limits_a_gateway_kernel_can_set_on_itself(any_gateway, tmp_path, recorder):
    events, sink = recorder
    s = settings(any_gateway, tmp_path, memory_mb=2048, max_open_files=256, max_file_mb=8, cpu_seconds=100)
    async with HandsFactory(s) as factory:
        hands = factory("limits", {}, sink)
        obs = await hands.execute("import resource as r; print(r.getrlimit(r.RLIMIT_NOFILE), r.getrlimit(r.RLIMIT_FSIZE), "
                                  "r.getrlimit(r.RLIMIT_AS)[0] // 2**20)")
        assert obs.stdout.split() == ["(256,", "256)", f"({8 * 2**20},", f"{8 * 2**20})", str(2048 + 1024)], obs.text()
        obs = await hands.execute("open('big.bin', 'wb').write(b'x' * (9 * 2**20))")
        assert not obs.ok and obs.error["ename"] in ("OSError", "ProcessLookupError", "KernelDied"), obs.text()
        limits = next(p for t, p in events if t == "hands_started")["limits"]
        assert set(limits) >= {"memory", "open_files", "file_size", "cpu", "processes"}
        assert limits["open_files"].startswith("rlimit 256, set in the kernel")
        assert limits["processes"].startswith("not enforced")
        # and what a gateway's kernel lacks that one on this machine has
        assert limits["workspace"].startswith("none here") and limits["spare"].startswith("none:"), limits
        assert limits["egress"].startswith("the gateway's"), limits


async def test_the_pool_serves_a_replacement_at_once(any_gateway, tmp_path, recorder):
    events, sink = recorder
    async with HandsFactory(settings(any_gateway, tmp_path, pool_size=1)) as factory:
        hands = factory("pooled", {}, sink)
        assert (await hands.execute("x = 1")).ok
        deadline = time.monotonic() + 120
        while factory.pool.status()["ready"] < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        os.kill(any_gateway.kernel_pid(hands.status()["kernel_id"]), signal.SIGKILL)
        for _ in range(5):
            obs = await hands.execute("1+1", timeout=60)
            if obs.ok:
                break
        assert obs.result == "2"
        started = [p for t, p in events if t == "hands_started"]
        assert [p["pooled"] for p in started] == [True, True]


HOST = """
import asyncio, sys, time
from workbench.hands.factory import HandsFactory, HandsSettings
async def main():
    settings = HandsSettings(backend="gateway", gateway_url=sys.argv[1], gateway_token=sys.argv[2], pool_size=0,
                             registry_dir=sys.argv[3])
    async with HandsFactory(settings) as factory:
        hands = factory("doomed", {"hands": {"startup_timeout": 120}}, None)
        assert (await hands.execute("x = 1")).ok
        print(hands.status()["kernel_id"], flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_kernels_a_killed_host_left_on_the_gateway_are_deleted_by_the_next_host(any_gateway, tmp_path):
    """A host killed by SIGKILL cannot delete its kernels on the gateway; the registry names them (by id and
    gateway, never the token), and the next host's start deletes them there. A live host's kernel is left alone."""
    import subprocess
    import sys

    registry = tmp_path / "registry"
    async with HandsFactory(settings(any_gateway, tmp_path)) as live:  # a host that stays: its kernel is not touched
        mine = live("alive", {"hands": {"startup_timeout": 120}}, None)
        assert (await mine.execute("y = 2")).ok
        mine_id = mine.status()["kernel_id"]
        proc = subprocess.Popen([sys.executable, "-c", HOST, any_gateway.url, any_gateway.token, str(registry)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 180)
            assert line.strip(), proc.stderr.read()[-2000:] if proc.poll() is not None else "the host printed nothing"
            orphan = line.strip()
        finally:
            proc.kill()
            proc.wait()
        assert orphan in any_gateway.kernels() and mine_id in any_gateway.kernels()
        assert len(list(registry.glob("gateway-*.json"))) == 2
        async with HandsFactory(settings(any_gateway, tmp_path)):  # the next host: its start reaps
            pass
        assert orphan not in any_gateway.kernels(), "the killed host's kernel is still on the gateway"
        assert mine_id in any_gateway.kernels(), "a live host's kernel was deleted"
        assert [p.stem for p in registry.glob("gateway-*.json")] == [f"gateway-{mine_id}"]
        assert (await mine.execute("y")).result == "2"
    assert mine_id not in any_gateway.kernels() and not list(registry.glob("gateway-*.json"))
