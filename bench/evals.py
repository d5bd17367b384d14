"""7. Evals: 40 attempts one at a time versus 8 at a time, and the harness's CPU per attempt.

Each attempt is what a real run does: a sandboxed kernel of its own runs the agent's one code cell
(scripted model), then fresh sandboxed hands run the verifier over a copy of the workspace. The CPU
is this process's (brain, log, copies, verifier orchestration), not the kernels'.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from .common import Context, Section, ms


def tasks(n: int) -> list:
    from workbench.evals import Task, TaskLimits, Verifier

    return [Task(f"sq-{i}", f"What is {i} squared? Answer with the number.", Verifier.python(f"assert answer.strip() == '{i * i}'"),
                 files={"input.txt": f"{i}\n".encode()}, limits=TaskLimits(turns=1),
                 scripted=({"code": ["print(int(open('input.txt').read()) ** 2)"], "answer": "{output}"},))
            for i in range(n)]


async def one_run(ctx: Context, n: int, parallel: int, label: str,
                  spied: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] | None = None) -> tuple[float, float, int]:
    """(wall ms, harness CPU ms, attempts passed) of a run of n attempts, `parallel` at a time; `spied(work)`, when
    given, runs the attempts (a profile of them: the host's opening and closing are not an attempt's)."""
    from workbench.hands.factory import HandsSettings
    from workbench.host import Host

    db = ctx.tmp / f"evals-{label}.duckdb"
    async with Host.open(db, hands=HandsSettings(pool_size=0, registry_dir=str(ctx.tmp / "kernels"))) as host:
        run = host.plugin("evals").make_run(tasks(n), ["scripted:eval"], parallel=parallel)
        c0, t0 = time.process_time(), time.perf_counter()
        result: list[Any] = []

        async def attempts() -> None:
            result.append(await run.run())

        await (attempts() if spied is None else spied(attempts))
        wall, cpu = ms(t0), (time.process_time() - c0) * 1000
        df = result[0]
    return wall, cpu, int(df.passed.sum())


async def run(ctx: Context) -> Section:
    import os

    from . import floors
    from .common import profile

    sec = Section("evals", "Evals: attempts one at a time versus 8 at a time (scripted model, sandboxed hands)")
    n = 2 if ctx.quick else 40  # quick: two, so --parallel runs two at once (CI checks that the section works)
    # one attempt first, not timed: what the first attempt of a process imports (the evals, the verifier, the
    # scripted model) is the process's start-up, not an attempt's (it was half the quick figure)
    await one_run(ctx, 1, 1, "warm-up")
    seq_wall, seq_cpu, seq_ok = await one_run(ctx, n, 1, "sequential")
    par_wall, par_cpu, par_ok = await one_run(ctx, n, 8, "parallel")
    if seq_ok != n or par_ok != n:
        raise RuntimeError(f"attempts failed: {n - seq_ok} sequential, {n - par_ok} parallel")
    sec.row(f"{n} attempts, sequential (whole run)", [seq_wall], attempts=n, per_attempt_ms=round(seq_wall / n, 1))
    sec.row(f"{n} attempts, --parallel 8 (whole run)", [par_wall], attempts=n, per_attempt_ms=round(par_wall / n, 1))
    sec.row("harness CPU per attempt, sequential", [seq_cpu / n])
    sec.row("harness CPU per attempt, --parallel 8", [par_cpu / n])
    # the floor: what an attempt needs from a kernel client, twice (its agent's kernel and its verifier's)
    floor = 2 * await floors.raw_kernel_cell(ctx.trials(1, 5))
    sec.row("floor: client CPU to start a local kernel, run one cell, shut it down; twice", [floor])
    per = seq_cpu / n
    prof: dict = {}
    if per > 100:  # where the CPU goes: this process, over a second sequential run

        async def spied(work: Callable[[], Awaitable[Any]]) -> None:
            prof.update(await profile(os.getpid(), work))

        await one_run(ctx, ctx.trials(1, n), 1, "profiled", spied)
    sec.goal("eval harness CPU per one-cell attempt (kernels excluded), sequential", per, "ms", "<= 100 ms", per <= 100,
             floor=floor, floor_what="raw jupyter_client: start a kernel, run a cell, shut it down, twice", profile=prof)
    sec.compare(f"{n} attempts, --parallel 8 vs sequential (wall)", par_wall, seq_wall)
    sec.notes.append("Each attempt starts two sandboxed kernels (the agent's, then the verifier's over a copy of the "
                     "workspace): on a 2-core machine kernel start-up is CPU-bound, so 8 at a time cannot be 8 times faster. "
                     "The harness CPU is this process's time (brain, log, workspace copies), divided by the attempts.")
    return sec
