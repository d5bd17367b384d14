"""2. Recovery: a kernel killed with SIGKILL, to the next call answered.

- cold: KernelHands without a pool; the next execute notices the death and boots a new kernel;
- warm pool: KernelHands from the HandsFactory's warm pool (full before each trial);
- jupyter_server (peer): a real `jupyter server` subprocess; POST /api/kernels/{id}/restart,
  then a new kernel websocket runs the next execute.
What is timed, for all three: from just after os.kill(pid, SIGKILL) returns to the execute_reply of
`1+1` (for the hands: repeated while they report the death, until a call answers with 2).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx

from .common import Context, Section, ms
from .first_response import _pool_ready


async def _hands_recovery(hands: Any, trials: int, before: Any = None) -> list[float]:
    out = await hands.execute("x = 1")
    if not out.ok:
        raise RuntimeError(f"the hands did not start: {out.text()}")
    samples = []
    for _ in range(trials):
        if before is not None:
            await before()
        os.kill(hands.status()["pid"], signal.SIGKILL)
        t0 = time.perf_counter()
        for _attempt in range(5):
            obs = await hands.execute("1+1")
            if obs.ok:
                break
        else:
            raise RuntimeError(f"no answer after the kill: {obs.text()}")
        samples.append(ms(t0))
        if obs.result != "2":
            raise RuntimeError(f"unexpected result after recovery: {obs.text()}")
    return samples


async def _jupyter_server_recovery(ctx: Context, trials: int) -> tuple[list[float], list[float]]:
    from .jserver import JupyterServer, ws_execute

    server = await asyncio.to_thread(JupyterServer(ctx.tmp / "jserver-recovery", workbench=False).start)
    restart_ms, answer_ms = [], []
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=60) as http:
            r = await http.post("/api/kernels", json={"name": "python3"})
            r.raise_for_status()
            kid = r.json()["id"]
            reply = await ws_execute(server, kid, "x = 1")
            if reply.get("status") != "ok":
                raise RuntimeError(f"the jupyter server kernel did not run code: {reply}")
            for _ in range(trials):
                pid = server.kernel_pid(kid)
                os.kill(pid, signal.SIGKILL)
                t0 = time.perf_counter()
                r = await http.post(f"/api/kernels/{kid}/restart")
                r.raise_for_status()
                restart_ms.append(ms(t0))
                reply = await ws_execute(server, kid, "1+1")
                answer_ms.append(ms(t0))
                if reply.get("status") != "ok":
                    raise RuntimeError(f"the restarted kernel did not answer: {reply}")
            await http.delete(f"/api/kernels/{kid}")
    finally:
        await asyncio.to_thread(server.stop)
    return restart_ms, answer_ms


async def run(ctx: Context) -> Section:
    sec = Section("recovery", "Recovery: kernel killed (SIGKILL) to the next call answered")
    from workbench.hands import HandsConfig, KernelHands

    trials = ctx.trials(1, 10)
    started: list[dict[str, Any]] = []

    async def sink(type: str, payload: dict[str, Any]) -> None:
        if type == "hands_started":
            started.append(payload)

    cold = KernelHands(HandsConfig(), on_event=sink)
    try:
        sec.row("cold restart (KernelHands, no pool)", await _hands_recovery(cold, trials))
    finally:
        await cold.shutdown()
    boots = [p["boot_ms"] for p in started[1:] if p.get("boot_ms")]
    if boots:
        sec.row("  of which: kernel boot to ready (hands_started.boot_ms)", boots)

    from workbench.hands.factory import HandsFactory, HandsSettings

    # like with like: the cold row above is a plain local kernel, so the pool row is too
    settings = HandsSettings(backend="local", pool_size=1, registry_dir=str(ctx.tmp / "registry-recovery"))
    async with HandsFactory(settings) as factory:
        hands = factory("bench-recovery", {}, None)
        sec.row("warm pool (HandsFactory, pool_size=1)", await _hands_recovery(hands, trials, lambda: _pool_ready(factory)))
    # the default backend: a sandboxed kernel binds the session's workspace when bwrap starts,
    # so after a death the replacement boots with that workspace instead of coming from the pool
    settings = HandsSettings(backend="sandbox", pool_size=1, spare=False, registry_dir=str(ctx.tmp / "registry-recovery-sbx"))
    async with HandsFactory(settings) as factory:
        if factory.mode == "sandbox":
            hands = factory("bench-recovery-sandbox", {}, None)
            sec.row("sandboxed, no spare (spare=false), pool_size=1", await _hands_recovery(hands, trials, lambda: _pool_ready(factory)))
        else:
            sec.notes.append("sandboxed recovery: skipped: no working sandbox on this machine")

    restart, answer = await _jupyter_server_recovery(ctx, trials)
    sec.row("jupyter_server: POST .../restart returned", restart)
    sec.row("jupyter_server: restart + websocket execute answered", answer)

    p50 = {r["case"]: r["p50_ms"] for r in sec.rows}
    cold50 = p50["cold restart (KernelHands, no pool)"]
    if "warm pool (HandsFactory, pool_size=1)" in p50:
        w = p50["warm pool (HandsFactory, pool_size=1)"]
        sec.compare("warm pool vs cold restart (p50)", w, cold50, target="< 20 % of cold", met=w < 0.2 * cold50)
        sec.compare("warm pool vs jupyter_server restart (p50)", w, p50["jupyter_server: restart + websocket execute answered"])
    sec.compare("cold restart vs jupyter_server restart (p50)", cold50, p50["jupyter_server: restart + websocket execute answered"])
    sec.notes.append("Timed from just after os.kill(pid, SIGKILL) to the answer of `1+1`. The hands notice the death "
                     "themselves (process poll) on the next execute; the jupyter_server side is POST "
                     "/api/kernels/{id}/restart, then a new websocket on /api/kernels/{id}/channels running the execute. "
                     "The warm pool is full before each trial (a server that has been up for a while).")
    return sec
