"""3. Tool round trip: the same cells through the workbench and through the usual Jupyter clients.

- raw jupyter_client: AsyncKernelClient.execute, then iopub until the kernel is idle again;
- nbclient: NotebookClient.async_execute_cell on a notebook holding the cells;
- workbench hands: KernelHands.execute (observation building, death polling, output cap);
- workbench python tool: the `python` tool on those hands (tool input checks, tool_result content);
- workbench brain step: a whole loop step with the scripted model: build the request from the log,
  stream the model's reply, append assistant_turn, tool_started, run the tool, append tool_result.
All kernels are local ipykernels over ipc, one per system, started before timing; rounds interleave
the systems, so no system runs a cell on a kernel that has just finished the previous one.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import Context, Section, ms, percentile

CELLS = ["1+1", "print('x' * 1000)", "import math\nsum(math.sqrt(i) for i in range(10000))"]


class RawKernel:
    """A kernel driven with jupyter_client alone: what a hand-written harness would do."""

    async def start(self, tmp: Path) -> None:
        from jupyter_client import AsyncKernelManager

        from workbench.hands import kernel_env

        d = Path(tempfile.mkdtemp(dir=tmp, prefix="raw-"))
        self.km = AsyncKernelManager(kernel_name="python3", transport="ipc")
        self.km.connection_file, self.km.ip = str(d / "kernel.json"), str(d / "ipc")
        await self.km.start_kernel(env=kernel_env(), cwd=str(d))
        self.kc = self.km.client()
        self.kc.start_channels()
        await self.kc.wait_for_ready(timeout=60)

    async def execute(self, code: str) -> list[dict[str, Any]]:
        msg_id = self.kc.execute(code)
        outputs = []
        while True:
            msg = await self.kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return outputs
            outputs.append(msg)

    async def stop(self) -> None:
        self.kc.stop_channels()
        await self.km.shutdown_kernel(now=True)


async def _brain_steps(ctx: Context, steps: int) -> list[float]:
    """Per-step time of a turn of `steps` python calls (scripted model), from tool_result to tool_result."""
    from workbench.brain import Brain
    from workbench.brain.models import Reply, ScriptedModel
    from workbench.hands.factory import HandsFactory, HandsSettings
    from workbench.log import DuckDBLog

    def script(request: dict[str, Any]) -> Reply:
        n = sum(1 for m in request["messages"] if m["role"] == "assistant")
        return Reply(text="next", code=[CELLS[n % len(CELLS)]]) if n < steps else Reply(text="done")

    log = DuckDBLog(ctx.tmp / "roundtrip.duckdb")
    marks: list[float] = []
    log.subscribe(lambda e: marks.append(time.perf_counter()) if e.type == "tool_result" else None)
    factory = HandsFactory(HandsSettings(pool_size=0, registry_dir=str(ctx.tmp / "registry-roundtrip")))
    brain = Brain(log, model_factory=lambda name: ScriptedModel(script, name=name), hands_factory=factory)
    try:
        sid = brain.create_session(model="bench-steps")["id"]
        stop = await brain.run_turn(sid, "go")
        if stop != "end_turn" or len(marks) != steps:
            raise RuntimeError(f"the brain turn ended with {stop!r} after {len(marks)} of {steps} calls")
        # the first step includes the lazy kernel start: leave it out
        return [ms(a, b) for a, b in zip(marks[1:], marks[2:])]
    finally:
        await brain.close()
        await factory.close()
        await asyncio.to_thread(log.close)


async def run(ctx: Context) -> Section:
    sec = Section("tool_round_trip", "Tool round trip: harness overhead per call on the same cells")
    import nbformat
    from jupyter_client import AsyncKernelManager
    from nbclient import NotebookClient

    from workbench.brain.tools import PYTHON, ToolContext
    from workbench.hands import HandsConfig, KernelHands

    rounds = ctx.trials(3, 50)
    raw = RawKernel()
    hands = KernelHands(HandsConfig())
    tool_hands = KernelHands(HandsConfig())  # a kernel of its own, like every other system here
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    d = Path(tempfile.mkdtemp(dir=ctx.tmp, prefix="nbclient-"))
    nb_km = AsyncKernelManager(kernel_name="python3", transport="ipc")
    nb_km.connection_file, nb_km.ip = str(d / "kernel.json"), str(d / "ipc")
    client = NotebookClient(nb, km=nb_km, kernel_name="python3", timeout=60)
    async def the_hands() -> Any:
        return tool_hands

    tool_ctx = ToolContext("bench", the_hands, None)
    samples: dict[str, dict[str, list[float]]] = {k: {c: [] for c in CELLS} for k in ("raw", "nbclient", "hands", "tool")}

    async def one(system: str, i: int) -> None:
        code = CELLS[i]
        t0 = time.perf_counter()
        if system == "raw":
            await raw.execute(code)
        elif system == "nbclient":
            await client.async_execute_cell(nb.cells[i], i)
        elif system == "hands":
            obs = await hands.execute(code)
            if not obs.ok:
                raise RuntimeError(obs.text())
        else:
            out = await PYTHON.run({"code": code}, tool_ctx)
            if out.is_error:
                raise RuntimeError(out.content)
        return ms(t0)

    try:
        await raw.start(ctx.tmp)
        await hands.start()
        await tool_hands.start()
        async with client.async_setup_kernel():
            warm = ctx.trials(1, 3)
            for r in range(rounds + warm):  # warm-up rounds first
                for i, code in enumerate(CELLS):
                    for system in samples:
                        t = await one(system, i)
                        if r >= warm:
                            samples[system][code].append(t)
        steps = await _brain_steps(ctx, ctx.trials(4, 3 * len(CELLS) * 10))
    finally:
        await raw.stop()
        await hands.shutdown()
        await tool_hands.shutdown()
        if nb_km.has_kernel:  # nbclient leaves a kernel manager it was given running
            await nb_km.shutdown_kernel(now=True)

    names = {"raw": "raw jupyter_client (execute + iopub to idle)", "nbclient": "nbclient async_execute_cell",
             "hands": "workbench KernelHands.execute", "tool": "workbench python tool (on KernelHands)"}
    p50 = {}
    for system, by_cell in samples.items():
        every = [t for ts in by_cell.values() for t in ts]
        per_cell = "; ".join(f"{c.splitlines()[0][:24]!r}: {percentile(ts, 50):.2f}" for c, ts in by_cell.items())
        p50[system] = sec.row(names[system], every, p50_by_cell=per_cell)["p50_ms"]
    p50["brain"] = sec.row("workbench brain step (scripted model + python tool + 4 log appends)", steps)["p50_ms"]
    for system in ("hands", "tool"):
        diff = p50[system] - p50["raw"]
        sec.compare(f"{names[system]} above raw jupyter_client (p50)", p50[system], p50["raw"], kind="difference",
                    target="< 5 ms above raw", met=diff < 5)
    sec.compare("nbclient vs raw jupyter_client (p50)", p50["nbclient"], p50["raw"], kind="difference")
    sec.compare("brain step vs raw jupyter_client (p50)", p50["brain"], p50["raw"], kind="difference")
    sec.notes.append(f"Cells: {', '.join(repr(c) for c in CELLS)}; each round runs every cell on every system in turn.")
    return sec
