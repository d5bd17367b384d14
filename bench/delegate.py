"""7. Delegation: a parent's wall time for 4 children (2 in quick mode) in parallel vs one after another, and harness
CPU per child.

The parent is the scripted model: one `delegate` call with 4 tasks (parallel), or 4 responses with
one single-task call each (sequential). Each child (`scripted:worker`) starts a kernel of its own
(local hands, no warm pool: the same for both sides) and runs one cell that sleeps 1 s and sums a
range, then answers. Harness CPU is this process's CPU time (the brain, the log, the hands' clients;
not the kernels, which are other processes) during the parent's turn, per child; a run whose children
run no code at all (no kernel) gives the harness's own cost per child.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .common import Context, Section, ms

N = 4
WORK = "import time; time.sleep(1); print(sum(range(10**6)))"


def task(i: int, code: bool = True) -> dict[str, Any]:
    prompt = f"```python\n{WORK}\n```" if code else f"say hello, child {i}"
    return {"prompt": prompt, "model": "scripted:worker", "title": f"child {i}"}


def sequential_script(n: int) -> Any:
    """A script of one single-task delegate call per response, n of them, then a summary."""
    from workbench.brain.models.scripted import Reply, position

    def script(request: dict[str, Any]) -> Any:
        _, step, _ = position(request)
        if step < n:
            return Reply(text=f"Child {step + 1}.", tool_calls=[("delegate", {"tasks": [task(step)]})])
        return Reply(text="All done.")

    return script


async def one_run(path: Any, how: str, code: bool = True, n: int = N) -> tuple[float, float, int]:
    """(parent wall ms, harness CPU ms per child, children answered) of one parent turn on a fresh log."""
    from workbench.delegate import DelegatePlugin
    from workbench.hands.factory import HandsFactory, HandsSettings
    from workbench.host import Host
    from workbench.plugins import Plugin

    class BenchScripts(Plugin):
        def scripts(self) -> dict[str, Any]:
            return {"bench-sequential": sequential_script(n)}

    hands = HandsFactory(HandsSettings(backend="local", pool_size=0, registry_dir=str(path.parent / f"{path.stem}-k")))
    async with Host.open(path, hands=hands, plugins=[DelegatePlugin(), BenchScripts(name="bench-scripts")]) as host:
        if how == "parallel":
            model, text = "scripted:delegate", "```json\n" + json.dumps({"tasks": [task(i, code) for i in range(n)]}) + "\n```"
        else:
            model, text = "scripted:bench-sequential", "run the children one by one"
        sid = host.brain.create_session(model=model, tools=["python", "delegate"])["id"]
        cpu0, t0 = time.process_time(), time.perf_counter()
        stop = await host.brain.run_turn(sid, text)
        wall, cpu = ms(t0), (time.process_time() - cpu0) * 1000
        if stop != "end_turn":
            raise RuntimeError(f"the parent's turn ended with {stop!r}")
        kids = [c for e in host.log.events(sid, types=["tool_result"]) for c in e.payload.get("children", [])]
        if len(kids) != n or any(c["status"] != "done" for c in kids):
            raise RuntimeError(f"children did not all finish: {[c['status'] for c in kids]}")
        return wall, cpu / n, len(kids)


async def run(ctx: Context) -> Section:
    n = ctx.trials(2, N)  # quick: two children still run side by side, and one after the other
    sec = Section("delegate", f"Delegation: {n} children in parallel vs one after another (scripted models, local hands)")
    trials = ctx.trials(1, 3)
    results: dict[str, tuple[list[float], list[float]]] = {}
    for how, code in (("parallel", True), ("sequential", True), ("parallel", False)):
        walls, cpus = [], []
        for t in range(trials):
            wall, cpu, _ = await one_run(ctx.tmp / f"delegate-{how}-{code}-{t}.duckdb", how, code, n)
            walls.append(wall)
            cpus.append(cpu)
        results[f"{how}-{code}"] = (walls, cpus)
        what = f"{n} children {how}" + ("" if code else ", no code (no kernels)")
        sec.row(f"{what}: parent wall time", walls)
        sec.row(f"{what}: harness CPU per child", cpus)
    par, seq = results["parallel-True"][0], results["sequential-True"][0]
    sec.compare(f"parent wall time, {n} children in parallel vs sequential (p50)", sorted(par)[len(par) // 2],
                sorted(seq)[len(seq) // 2])
    sec.notes.append(f"Each child's cell sleeps 1 s, so {n} sequential children take at least {n} s plus {n} kernel starts; "
                     "in parallel the kernel starts share the machine's 2 cores.")
    return sec
