"""1. First response: user message recorded -> first model request at the server -> first streamed token.

Three designs, same process, same fake Messages API (driven through the real SDK):
- lazy: the product's default hands, started by the first tool call;
- pooled: the product's HandsFactory with a warm pool (steady state: the pool is full before each trial);
- coupled (baseline): the design we replace: start the session's kernel, wait until it is ready,
  then call the model. It lives here, in bench/, as a model wrapper; the product is unchanged.
Each trial is a new session whose turn makes one `python` call, so every design uses its hands.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .common import Context, Section, ms

TEXT = "Check the kernel with a quick print, please."


class TimedList(list):
    """The fake server's request list, noting when each request reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Any) -> None:
        self.times.append(time.perf_counter())
        super().append(item)


class CoupledModel:
    """The baseline: before a session's first model call, start its kernel and wait until it is ready."""

    def __init__(self, inner: Any, brain: Any):
        self.inner, self.brain, self.name = inner, brain, inner.name
        self.session_id: str | None = None  # the session whose turn runs now (trials run one at a time)
        self._started: set[str] = set()

    async def stream(self, request: dict[str, Any]):
        sid = self.session_id
        if sid is not None and sid not in self._started:
            self._started.add(sid)
            await (await self.brain.hands(sid)).start()
        async for ev in self.inner.stream(request):
            yield ev

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run(ctx: Context) -> Section:
    sec = Section("first_response", "First response: user message to first model request and first token")
    from workbench.brain import Brain
    from workbench.brain.models import AnthropicModel, Reply
    from workbench.log import DuckDBLog
    from workbench.testing import FakeMessagesAPI

    from workbench.hands.factory import HandsFactory, HandsSettings

    api = FakeMessagesAPI([Reply(text="Running it.", code=["print('ready')"]), Reply(text="It printed ready.")]).start()
    api.requests = TimedList()
    log = DuckDBLog(ctx.tmp / "first_response.duckdb")
    t_user: dict[str, float] = {}
    t_token: dict[str, float] = {}

    def on_commit(e: Any) -> None:
        if e.type == "user_message":
            t_user[e.session_id] = time.perf_counter()

    def on_delta(sid: str, ev: dict[str, Any]) -> None:
        if ev.get("type") == "content_block_delta" and sid not in t_token:
            t_token[sid] = time.perf_counter()

    log.subscribe(on_commit)

    shared = AnthropicModel("bench", api_key="bench-key", base_url=api.url)

    def sdk_model(name: str) -> Any:
        return shared  # one SDK client for every design: the same warm HTTP connection pool

    brains: dict[str, Any] = {}
    factory = None
    coupled: CoupledModel | None = None
    unpooled = HandsFactory(HandsSettings(pool_size=0, registry_dir=str(ctx.tmp / "registry-fr0")))
    try:
        brains["lazy"] = Brain(log, model_factory=sdk_model, hands_factory=unpooled)
        factory = HandsFactory(HandsSettings(pool_size=1, registry_dir=str(ctx.tmp / "registry-fr")))
        await factory.start()
        brains["pooled"] = Brain(log, model_factory=sdk_model, hands_factory=factory)
        cb = Brain(log, hands_factory=unpooled)

        def coupled_factory(name: str) -> Any:
            nonlocal coupled
            coupled = CoupledModel(sdk_model(name), cb)
            return coupled

        cb.model_factory = coupled_factory
        brains["coupled"] = cb
        for b in brains.values():
            b.listen(on_delta)

        samples: dict[str, dict[str, list[float]]] = {k: {"request": [], "token": []} for k in brains}
        # warm up the SDK (imports, connection) once, outside any trial
        async for _ in shared.stream({"model": "bench", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}):
            pass
        trials = ctx.trials(1, 20)
        for i in range(trials):
            for name, brain in brains.items():
                if name == "pooled":
                    await _pool_ready(factory)
                sid = brain.create_session(model="bench", title=f"first-response {name} {i}")["id"]
                if name == "coupled":
                    brain.model("bench").session_id = sid
                seen = len(api.requests.times)
                stop = await brain.run_turn(sid, TEXT)
                if stop != "end_turn":
                    raise RuntimeError(f"{name}: the turn ended with {stop!r}: {api.rejections[-1:]}")
                t_req = api.requests.times[seen]
                samples[name]["request"].append(ms(t_user[sid], t_req))
                samples[name]["token"].append(ms(t_user[sid], t_token[sid]))
                await brain.close_session(sid)
        for name, s in samples.items():
            sec.row(f"{name}: to first request", s["request"])
            sec.row(f"{name}: to first token", s["token"])
        p50 = {(r["case"]): r["p50_ms"] for r in sec.rows}
        for name in ("lazy", "pooled"):
            if name not in brains:
                continue
            v, b = p50[f"{name}: to first request"], p50["coupled: to first request"]
            sec.compare(f"{name} vs coupled, first request (p50)", v, b,
                        target="< 10 % of coupled", met=v < 0.10 * b)
            sec.compare(f"{name} vs coupled, first token (p50)", p50[f"{name}: to first token"],
                        p50["coupled: to first token"])
        sec.notes.append("Each trial is a new session; the turn makes one python call. The coupled baseline starts "
                         "the session's kernel (KernelHands.start: boot, wait ready, install the output cap) before "
                         "its first model call; lazy and pooled start or take one at the tool call.")
        return sec
    finally:
        for b in brains.values():
            await b.close()  # closes the shared SDK client too (closing it twice is harmless)
        if factory is not None:
            await factory.close()
        await unpooled.close()
        await asyncio.to_thread(log.close)
        api.stop()


async def _pool_ready(factory: Any, timeout: float = 60.0) -> None:
    """Wait until the warm pool is full: the steady state of a server that has been up a while."""
    deadline = time.monotonic() + timeout
    while factory.pool is not None and factory.pool.status()["ready"] < factory.pool.size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool did not fill in {timeout:.0f} s: {factory.pool.status()}")
        await asyncio.sleep(0.02)
