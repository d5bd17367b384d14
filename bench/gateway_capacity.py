"""What one brain host pays per concurrent session and per eval attempt when its hands are on Enterprise Gateway.

`python -m bench.gateway_capacity [--levels 1,10,50] [--json OUT]`: a Jupyter Enterprise Gateway 3.3 from
its own environment (tests/support/egsupport.py makes `.venv-eg` once) and, in this process, a `Host`
(brain, DuckDB log, hands on the gateway, no warm pool): the brain host. At each level N:

- sessions: N sessions (`scripted` model) each run one turn whose one `python` call holds its kernel for
  5 s, all at once, so that N sessions are live together;
- attempts: an eval run of N one-cell attempts with a python verifier (`scripted:eval`), N at a time: each
  attempt's agent and verifier kernels are on the gateway.

Each kind runs once at level 1 first, uncounted (first imports and caches). For each: the brain host's CPU seconds (this process: brain, log, hands' websockets; never the kernels'
or the gateway's) per session or attempt, and its RSS at the peak over its RSS before, per session or
attempt (sampled every 50 ms by a thread whose own CPU is not counted); the gateway's and its kernels' CPU and peak RSS are printed beside, as they
would be on other machines. Not a timed test: figures on a shared machine are noisy; the load average is
printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
HOLD = 5.0  # seconds each session's call holds its kernel, so that the sessions overlap


class Sampler:
    """Peak RSS of this process, and of the gateway's tree, sampled in a thread while a block runs."""

    def __init__(self, gateway_pid: int):
        self.me, self.gw = psutil.Process(), psutil.Process(gateway_pid)
        self.peak = self.gw_peak = 0
        self.cpu = 0.0
        self._stop = threading.Event()

    def _gw_tree(self) -> tuple[int, float]:
        rss, cpu = 0, 0.0
        for p in [self.gw, *self.gw.children(recursive=True)]:
            try:
                rss += p.memory_info().rss
                t = p.cpu_times()
                cpu += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                continue
        return rss, cpu

    def gateway_cpu(self) -> float:
        return self._gw_tree()[1]

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.me.memory_info().rss)
            self.gw_peak = max(self.gw_peak, self._gw_tree()[0])
        self.cpu = time.thread_time()  # the sampling's own CPU, taken off the brain host's

    def __enter__(self) -> Sampler:
        self.peak = self.me.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def eval_tasks(n: int) -> list:
    from workbench.evals import Task, TaskLimits, Verifier

    return [Task(f"sq-{i}", f"What is {i} squared? Answer with the number.",
                 Verifier.python(f"assert answer.strip() == '{i * i}'"), limits=TaskLimits(turns=1),
                 scripted=({"code": [f"print({i} * {i})"], "answer": "{output}"},)) for i in range(n)]


async def measure(kind: str, n: int, gw: Any, tmp: Path) -> dict[str, Any]:
    """One level: the brain host's CPU and RSS per session (or attempt), the gateway's beside them."""
    from workbench.hands.factory import HandsSettings
    from workbench.host import Host

    hands = HandsSettings(backend="gateway", gateway_url=gw.url, gateway_token=gw.token, pool_size=0,
                          registry_dir=str(tmp / "kernels"))
    tmp.mkdir(exist_ok=True)
    async with Host.open(tmp / f"{kind}-{n}.duckdb", hands=hands) as host:
        sampler = Sampler(gw.pid)
        base, gw_cpu0 = psutil.Process().memory_info().rss, sampler.gateway_cpu()
        c0, t0 = time.process_time(), time.perf_counter()
        with sampler:
            if kind == "sessions":
                sids = [host.brain.create_session(model="scripted", config={"hands": {"startup_timeout": 120}})["id"]
                        for _ in range(n)]
                code = f"```python\nimport time\ntime.sleep({HOLD})\nprint('held')\n```"
                stops = await asyncio.gather(*(host.brain.run_turn(sid, code) for sid in sids))
                ok = 0
                for sid in sids:
                    results = [e.payload for e in await host.brain.events(sid) if e.type == "tool_result"]
                    ok += "held" in json.dumps(results)
                assert len(stops) == n
            else:
                run = host.plugin("evals").make_run(eval_tasks(n), ["scripted:eval"], parallel=n)
                df = await run.run()
                ok = int(df.passed.sum())
        cpu, wall = time.process_time() - c0 - sampler.cpu, time.perf_counter() - t0
        gw_cpu = sampler.gateway_cpu() - gw_cpu0
    return {"kind": kind, "n": n, "ok": ok, "wall_s": round(wall, 1), "host_cpu_s": round(cpu, 2),
            "host_cpu_ms_each": round(cpu * 1000 / n, 1), "host_rss_base_mb": round(base / 2**20, 1),
            "host_rss_peak_mb": round(sampler.peak / 2**20, 1),
            "host_rss_mb_each": round((sampler.peak - base) / 2**20 / n, 2),
            "gateway_cpu_s": round(gw_cpu, 1), "gateway_and_kernels_rss_peak_mb": round(sampler.gw_peak / 2**20)}


async def main_async(levels: list[int]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from egsupport import EnterpriseGateway

    rows = []
    with tempfile.TemporaryDirectory(prefix="wbcap-") as d:
        tmp = Path(d)
        os.environ["EG_KERNEL_LAUNCH_TIMEOUT"] = "600"  # EG's own (30 s): 50 kernels starting at once on 2 cores
        with EnterpriseGateway(tmp, "capacity") as gw:
            for kind in ("sessions", "attempts"):  # once, not counted: first imports (pandas for results) and caches
                await measure(kind, 1, gw, tmp / "warm")
            for n in levels:
                for kind in ("sessions", "attempts"):
                    row = await measure(kind, n, gw, tmp)
                    row["load_avg_1m"] = round(os.getloadavg()[0], 1)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,10,50", help="concurrent sessions / attempts, comma-separated")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    rows = asyncio.run(main_async(levels))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("| level | kind | ok | wall s | host CPU ms each | host RSS MiB each | host RSS peak MiB | gateway CPU s | "
          "gateway+kernels RSS peak MiB | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['kind']} | {r['ok']}/{r['n']} | {r['wall_s']} | {r['host_cpu_ms_each']} | "
              f"{r['host_rss_mb_each']} | {r['host_rss_peak_mb']} | {r['gateway_cpu_s']} | "
              f"{r['gateway_and_kernels_rss_peak_mb']} | {r['load_avg_1m']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
