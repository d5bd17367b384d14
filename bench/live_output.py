"""What live output costs the server: CPU seconds per second of a call streaming its output.

A real `jupyter server` subprocess with the workbench extension and the scripted model. One session
(its kernel warmed up first) runs calls that print a line of about 60 characters at a steady rate for
N seconds, and, as the baseline, calls that run as long and print nothing. Each runs with no client on
the session's websocket and with one reading it. The server process's CPU time (user + system, the
kernels not counted) is read before the message is posted and after the turn has ended (polled
over REST every 0.5 s, the same in every case); the baseline's CPU is subtracted, and the rest divided
by N is the cost per second of streaming.

Trials are interleaved (each round runs every case once), so a change in the machine's load during
the run weighs on every case alike. Also timed, in this process: the brain's side alone (a LiveOutput
fed pieces as fast as it takes them, its listener encoding each message as the server does). Each line
carries the time it was printed; the websocket client reports each line's lag from print to arrival
(p50, p95, max): what the sidebar, a `%%agent` cell or the CLI beside a server waits at best.

    python -m bench.live_output [--seconds N] [--trials K] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .common import machine

RATES = (100, 1000)  # lines per second
# The lines are written past the kernel's own output cap (type(sys.stdout).write, as any code can), so that
# they keep reaching the server for N seconds while the call's result (capped at the default output_limit,
# as are the assistant turn quoting it) stays small: what the client costs is then the live output's cost,
# not that of re-sending a big result.
CODE = (
    "```python\nimport sys, time\n_w = type(sys.stdout).write\nend = time.time() + {seconds}\ni = 0\n"
    "while time.time() < end:\n"
    "    {body}\n"
    "```"
)
# each line carries the wall-clock time it was printed at (kernel and client share this machine's clock),
# so a client can tell how long a line took from the kernel's print to its screen
PRINT = ("_w(sys.stdout, f'line {{i:>8}} {{time.time():.6f}} ' + 'x' * 27 + '\\n'); sys.stdout.flush(); i += 1; "
         "time.sleep({pause})")
LINE = re.compile(r"line +\d+ (\d+\.\d{6}) x")
SILENT = "time.sleep(0.05)"


async def _turn(http: httpx.AsyncClient, sid: str, text: str, proc: Any) -> float:
    """Post a message, wait for the turn to end; the server's CPU seconds meanwhile."""
    t = proc.cpu_times()
    before = t.user + t.system
    r = await http.post(f"/workbench/api/sessions/{sid}/messages", json={"text": text})
    r.raise_for_status()
    while True:
        await asyncio.sleep(0.5)
        s = (await http.get(f"/workbench/api/sessions/{sid}")).json()
        if not s["running"] and s["last_type"] == "turn_ended":
            break
    t = proc.cpu_times()
    return t.user + t.system - before


async def _reader(ws: Any, counts: dict[str, Any]) -> None:
    while True:
        raw = await ws.read_message()
        if raw is None:
            return
        now = time.time()
        msg = json.loads(raw)
        if msg["kind"] == "output":
            counts["messages"] += 1
            counts["chars"] += len(msg["text"])
            counts["bytes"] += len(raw)
            if not msg.get("snapshot"):  # each line's lag: from its print in the kernel to its arrival here
                counts["lags"] += [now - float(t) for t in LINE.findall(msg["text"])]
        else:
            counts["other_bytes"] += len(raw)


async def measure(seconds: float, trials: int, tmp: Path) -> dict[str, Any]:
    import psutil
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    from .jserver import JupyterServer

    home = tmp / "live-output"
    env = {"WORKBENCH_DB": str(home / "wb.duckdb"), "WORKBENCH_MODEL": "scripted", "WORKBENCH_HANDS_POOL_SIZE": "0"}
    server = JupyterServer(home, workbench=True, env=env)
    await asyncio.to_thread(server.start)
    results: dict[str, Any] = {"seconds": seconds, "trials": trials, "cases": {}}
    try:
        proc = psutil.Process(server.proc.pid)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as http:
            r = await http.post("/workbench/api/sessions", json={"model": "scripted", "title": "live output bench"})
            r.raise_for_status()
            sid = r.json()["id"]
            await _turn(http, sid, "```python\nprint('warm')\n```", proc)
            await _turn(http, sid, CODE.format(seconds=1, body=PRINT.format(pause=0.01)), proc)  # the first streamed call's one-off costs
            cases = [("silent", SILENT)] + [(f"{rate} lines/s", PRINT.format(pause=1 / rate)) for rate in RATES]
            keys = [(f"{name}, {'a websocket client' if attached else 'no client'}", CODE.format(seconds=seconds, body=body), attached)
                    for name, body in cases for attached in (False, True)]
            cpu: dict[str, list[float]] = {key: [] for key, _, _ in keys}
            counts: dict[str, dict[str, Any]] = {
                key: {"messages": 0, "chars": 0, "bytes": 0, "other_bytes": 0, "lags": []} for key, _, _ in keys}
            for trial in range(trials):
                for key, text, attached in keys[trial % len(keys):] + keys[:trial % len(keys)]:
                    ws = task = None
                    if attached:
                        after = (await http.get(f"/workbench/api/sessions/{sid}")).json()["last_seq"]
                        url = server.url.replace("http", "ws", 1) + f"/workbench/api/sessions/{sid}/stream?after={after}"
                        ws = await websocket_connect(HTTPRequest(url, headers=server.headers))
                        task = asyncio.ensure_future(_reader(ws, counts[key]))
                    try:
                        cpu[key].append(await _turn(http, sid, text, proc))
                    finally:
                        if ws is not None:
                            ws.close()
                        if task is not None:
                            await asyncio.wait({task}, timeout=10)
                    print(f"round {trial + 1}: {key}: server CPU {cpu[key][-1]:.3f} s", file=sys.stderr)
            for key, _, _ in keys:
                lags = sorted(counts[key].pop("lags"))
                results["cases"][key] = {"cpu_s": statistics.median(cpu[key]), "samples": cpu[key],
                                         **{k: v / trials for k, v in counts[key].items()}}
                if lags:
                    results["cases"][key]["lag_s"] = {"lines": len(lags), "p50": lags[len(lags) // 2],
                                                      "p95": lags[int(len(lags) * 0.95)], "max": lags[-1]}
    finally:
        await asyncio.to_thread(server.stop)
    return results


async def brain_side(pieces: int = 200_000) -> dict[str, float]:
    """The brain's share alone: CPU per piece of output through a LiveOutput whose listener encodes each message."""
    from workbench.brain.live import LiveOutput

    out = LiveOutput()
    sent = {"messages": 0, "bytes": 0}

    def encode(session_id: str, m: dict[str, Any]) -> None:
        sent["messages"] += 1
        sent["bytes"] += len(json.dumps({"kind": "output", "session_id": session_id, **m}))

    out.listen(encode)
    call = out.begin("bench", "toolu_bench", "python", lambda: "busy")
    line = "line " + "x" * 50 + "\n"
    t0 = time.process_time()
    for i in range(pieces):
        call.write("stdout", line)
        if i % 1000 == 999:
            await asyncio.sleep(0)  # let the coalescing timer run now and then, as the execute loop does
    out.end(call)
    cpu = time.process_time() - t0
    return {"pieces": pieces, "cpu_s": cpu, "us_per_piece": cpu / pieces * 1e6, **sent}


def report(res: dict[str, Any]) -> str:
    n = res["seconds"]
    cases = res["cases"]
    lines = ["| call (runs N s) | websocket | server CPU per call, s | minus the silent call, per streamed second "
             "| output messages per call | their bytes per call | bytes of the call's events |", "|---|---|---|---|---|---|---|"]
    for key, c in cases.items():
        name, _, who = key.partition(", ")
        base = cases[f"silent, {who}"]["cpu_s"]
        extra = "" if name == "silent" else f"{(c['cpu_s'] - base) / n:.3f}"
        wire = f"{c['messages']:.0f}" if "client" in who and "no" not in who else "-"
        size = f"{c['bytes']:,.0f}" if wire != "-" else "-"
        other = f"{c['other_bytes']:,.0f}" if wire != "-" else "-"
        lines.append(f"| {name} | {who} | {c['cpu_s']:.3f} | {extra} | {wire} | {size} | {other} |")
    lags = [(key, c["lag_s"]) for key, c in cases.items() if "lag_s" in c]
    if lags:
        lines += ["", "| call | lines received | lag from print to the websocket client: p50 | p95 | max |",
                  "|---|---|---|---|---|"]
        lines += [f"| {key.partition(', ')[0]} | {lag['lines']:,} | {lag['p50'] * 1000:.0f} ms | {lag['p95'] * 1000:.0f} ms "
                  f"| {lag['max'] * 1000:.0f} ms |" for key, lag in lags]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.live_output", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="how long each call prints (default 10)")
    p.add_argument("--trials", type=int, default=3, help="calls per case; the median is reported (default 3)")
    p.add_argument("--out", type=Path, help="also write the results as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wb-bench-live-") as tmp:
        res = asyncio.run(measure(args.seconds, args.trials, Path(tmp)))
    res["brain_side"] = asyncio.run(brain_side())
    res["machine"] = machine()
    print(report(res))
    b = res["brain_side"]
    print(f"\nBrain side alone: {b['us_per_piece']:.2f} µs of CPU per piece of output ({b['pieces']:,} pieces, {b['messages']} messages)")
    print(f"N = {args.seconds:g} s, {args.trials} trial(s) per case; load average {res['machine'].get('load_average')}")
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
