"""What every benchmark shares: trials, percentiles, a section's result, the machine's description, and the driver
of turns through a server's REST API and session streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

PACKAGES = ("jupyter-workbench", "jupyter_client", "ipykernel", "jupyter_server", "nbclient", "duckdb",
            "anthropic", "tornado", "pyzmq", "httpx")


@dataclass
class Context:
    """How a section should run: quick (CI) or full, and where it may write."""

    quick: bool
    tmp: Path

    def trials(self, quick: int, full: int) -> int:
        return quick if self.quick else full


@dataclass
class Section:
    """One benchmark's result: measured rows, the comparisons they support, or why it did not run."""

    key: str
    title: str
    status: str = "ok"  # ok | skipped | error
    reason: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    goals: list[dict[str, Any]] = field(default_factory=list)  # issue 24's Done-when, each against its floor
    seconds: float = 0.0

    def row(self, case: str, samples_ms: list[float], *, p99: bool = False, **extra: Any) -> dict[str, Any]:
        """Add a row summarising repeated trials (milliseconds)."""
        r = {"case": case, **summarise(samples_ms, p99=p99), **extra}
        self.rows.append(r)
        return r

    def compare(self, what: str, value: float | None, baseline: float | None, *, unit: str = "ms",
                target: str | None = None, met: bool | None = None, kind: str = "ratio") -> dict[str, Any]:
        """Add a comparison: value against baseline, their ratio (or difference), and a target if any."""
        ratio = value / baseline if value is not None and baseline else None
        diff = value - baseline if value is not None and baseline is not None else None
        c = {"what": what, "value": _r(value), "baseline": _r(baseline), "unit": unit,
             "ratio": _r(ratio, 3), "difference": _r(diff), "kind": kind, "target": target, "met": met}
        self.comparisons.append(c)
        return c

    def goal(self, what: str, value: float, unit: str, target: str, met: bool, *, floor: float | None = None,
             floor_what: str | None = None, profile: dict[str, Any] | None = None, why: str | None = None) -> dict[str, Any]:
        """Add a goal of the Done-when: the figure, its floor measured in this run and their ratio, the target,
        whether it is met, and when it is not, why: `why` when the measurement gives the reason itself (a wait
        for other processes), else where the CPU went, from a profile of that measurement."""
        g = {"goal": what, "value": _r(value, 3), "unit": unit, "floor": _r(floor, 3), "floor_what": floor_what,
             "ratio": _r(value / floor, 2) if floor else None, "target": target, "met": bool(met), "why": None}
        if not met:
            g["why"] = why or (shares(profile) if profile else "no profile of this measurement")
            g["profile"] = profile
        self.goals.append(g)
        return g

    def skip(self, reason: str) -> "Section":
        self.status, self.reason = "skipped", reason
        return self

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(float(x), nd)


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("no samples")
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarise(samples_ms: list[float], *, p99: bool = False) -> dict[str, Any]:
    out = {"n": len(samples_ms), "p50_ms": _r(percentile(samples_ms, 50), 3), "p95_ms": _r(percentile(samples_ms, 95), 3)}
    if p99:
        out["p99_ms"] = _r(percentile(samples_ms, 99), 3)
    out["min_ms"], out["max_ms"] = _r(min(samples_ms), 3), _r(max(samples_ms), 3)
    return out


def ms(t0: float, t1: float | None = None) -> float:
    """Milliseconds from perf_counter t0 to t1 (default: now)."""
    return ((t1 if t1 is not None else time.perf_counter()) - t0) * 1000


@contextlib.contextmanager
def env(**values: str | None) -> Iterator[None]:
    """Set (or, with None, remove) environment variables for the block, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def machine() -> dict[str, Any]:
    """The machine the figures come from, read at run time."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        import psutil

        ram = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    osname = platform.platform()
    try:
        rel = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
        osname = f"{rel.get('PRETTY_NAME', '').strip(chr(34))} ({platform.system()} {platform.release()})"
    except OSError:
        pass
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": ram,
        "os": osname,
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "packages": versions,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


# a leaf function in which a thread waits
IDLE = frozenset({"select", "poll", "epoll", "wait", "wait_for", "sleep", "_wait_for_tstate_lock", "_worker"})

# where a frame's time belongs, by the first of these its file or function names (the parts of issue 24's table)
PARTS = (
    ("the log's DuckDB statements (insert, commit, reads)", ("duckdb_log.py", "coldread.py", "duckdb")),
    ("the log's writer and its hand-offs (group commit, futures, callbacks)", ("log/writer.py", "concurrent/futures")),
    ("the websocket fan-out", ("fanout.py", "handlers.py", "websocket.py")),
    ("the kernel client (zmq, jupyter_client, the hands' execute loop)", ("jupyter_client", "zmq", "/hands/")),
    ("the scripted model", ("scripted.py", "models/base.py")),
    ("the brain (loop, request fold)", ("/brain/",)),
    ("JSON encoding and decoding", ("json/", "orjson", "payload.py")),
    ("HTTP and the event loop (tornado, asyncio)", ("tornado", "asyncio", "selectors")),
    ("importing modules", ("<frozen importlib",)),
)


def shares(profile: dict[str, Any]) -> str:
    """A not-met goal's reason in one line: the shares of the profiled CPU by part, largest first."""
    parts = profile.get("parts") or []
    if not parts:
        return f"no samples in the profile ({profile.get('skipped') or 'the measured process was idle'})"
    top = "; ".join(f"{name} {share}%" for name, share in parts[:5])
    return f"where the CPU went (py-spy, {profile['samples']} samples of the measured process's busy threads): {top}"


def summarise_stacks(lines: list[str], top: int = 15) -> dict[str, Any]:
    """Collapsed stacks ("frame;frame;... count") as shares of the busy samples: by frame (inclusive), by leaf
    (own), and by part of the harness (each sample to the part of its deepest frame that has one)."""
    import collections

    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        raw = stack.split(";")
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
                  for f in raw]
        leaf = frames[-1].split(" (")[0].rsplit(".", 1)[-1]
        if leaf in IDLE or frames[-1].startswith("_run_once (base_events"):  # a thread waiting, not working
            continue
        total += c
        for f in set(frames):
            inclusive[f] += c
        own[frames[-1]] += c
        part = next((name for f in reversed(raw) for name, keys in PARTS if any(k in f for k in keys)), "other")
        parts[part] += c
    share = (lambda c: round(100 * c / total, 1)) if total else (lambda c: 0.0)
    return {"samples": total, "inclusive": [(f, share(c)) for f, c in inclusive.most_common(top * 3)],
            "own": [(f, share(c)) for f, c in own.most_common(top)], "parts": [(p, share(c)) for p, c in parts.most_common()]}


def spy(pid: int) -> tuple[Any, Path] | str:
    """Start py-spy recording process `pid`: (its process, its output file), or why it cannot."""
    import shutil
    import subprocess
    import tempfile

    beside = Path(sys.executable).parent / "py-spy"  # installed in this environment, maybe not on PATH
    exe = str(beside) if beside.exists() else shutil.which("py-spy")
    if exe is None:
        return "py-spy is not installed (pip install py-spy)"
    out = Path(tempfile.gettempdir()) / f"workbench-bench-pyspy-{pid}-{time.monotonic_ns()}.txt"
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--output", str(out),
                             "--nonblocking", "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, out


async def spied(handle: tuple[Any, Path] | str) -> dict[str, Any]:
    """Stop a `spy` and summarise what it recorded."""
    import asyncio

    if isinstance(handle, str):
        return {"skipped": handle}
    proc, out = handle
    proc.send_signal(2)
    err = await asyncio.to_thread(proc.communicate, timeout=60)
    try:
        lines = out.read_text().splitlines()
        out.unlink()
    except OSError:
        return {"skipped": f"py-spy recorded nothing ({(err[1] or b'').decode()[-200:].strip()})"}
    return summarise_stacks(lines)


async def profile(pid: int, work: Any) -> dict[str, Any]:
    """py-spy's samples of process `pid` while `work()` runs (summarise_stacks), or why there are none."""
    import asyncio

    handle = spy(pid)
    if not isinstance(handle, str):
        await asyncio.sleep(1.0)  # py-spy attached
    try:
        await work()
    finally:
        result = await spied(handle)
    return result


# -- turns through a server: the scale and harness sections drive the same loop and measure different things ---------

T = TypeVar("T")


@dataclass
class Served:
    """A running `jupyter server` with the workbench extension and the scripted model, and a client of its REST API."""

    server: Any  # bench.jserver.JupyterServer
    http: Any  # httpx.AsyncClient on its URL, with its token
    streams: list[Any] = field(default_factory=list)  # the sessions' websockets, closed with the server

    async def sessions(self, n: int, title: str) -> list[tuple[str, Any]]:
        """n new sessions of the scripted model (titled `title i`), each with its event stream open: (id, websocket)."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        ids = []
        for i in range(n):
            r = await self.http.post("/workbench/api/sessions", json={"model": "scripted", "title": f"{title}{i}"})
            r.raise_for_status()
            ids.append(r.json()["id"])
        ws_base = self.server.url.replace("http", "ws", 1)
        for sid in ids:
            self.streams.append(await websocket_connect(HTTPRequest(f"{ws_base}/workbench/api/sessions/{sid}/stream?after=0",
                                                                    headers=self.server.headers)))
        return list(zip(ids, self.streams[-n:], strict=True))

    async def settle(self, timeout: float = 60.0) -> None:
        """Wait until the server's warm pool (if any) is full, so that neither a baseline nor a timed turn pays for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pool = ((await self.http.get("/workbench/api/status")).json().get("sandbox") or {}).get("pool")
            if not pool or pool["ready"] >= pool["size"] or pool.get("failures"):
                return
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def served(home: Path) -> AsyncIterator[Served]:
    """A fresh server and database in `home`, its warm pool full; stopped, with every stream, after the block."""
    import httpx

    from .jserver import JupyterServer

    server = JupyterServer(home, workbench=True, env={"WORKBENCH_DB": str(home / "wb.duckdb"), "WORKBENCH_MODEL": "scripted"})
    await asyncio.to_thread(server.start)
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as http:
            s = Served(server, http)
            try:
                await s.settle()
                yield s
            finally:
                for ws in s.streams:
                    ws.close()
    finally:
        await asyncio.to_thread(server.stop)


async def server_turn(http: Any, ws: Any, sid: str, text: str) -> tuple[float, list[dict[str, Any]], int]:
    """One turn: POST the message, read the session's stream until turn_ended. Returns the milliseconds from the
    accepted POST to turn_ended, the events read, and how many POSTs got 409 first: turn_ended is committed (and
    streamed) a moment before the turn's task is done, so a client that sends at once may be told the session is
    busy; it retries every 5 ms."""
    busy = 0
    while True:
        t0 = time.perf_counter()
        r = await http.post(f"/workbench/api/sessions/{sid}/messages", json={"text": text})
        if r.status_code != 409 or busy >= 200:
            break
        busy += 1
        await asyncio.sleep(0.005)
    r.raise_for_status()
    seen: list[dict[str, Any]] = []
    while True:
        raw = await asyncio.wait_for(ws.read_message(), 120)
        if raw is None:
            raise RuntimeError(f"the stream of session {sid} closed during a turn")
        msg = json.loads(raw)
        if msg["kind"] != "event":
            continue
        seen.append(msg["event"])
        if msg["event"]["type"] == "turn_ended":
            return ms(t0), seen, busy


async def rounds(sessions: list[tuple[str, Any]], turns: int, turn: Callable[[str, Any], Awaitable[T]]) -> list[list[T]]:
    """`turns` turns in a row in each session, the sessions at the same time: each session's results, in order."""

    async def one(sid: str, ws: Any) -> list[T]:
        return [await turn(sid, ws) for _ in range(turns)]

    return list(await asyncio.gather(*(one(sid, ws) for sid, ws in sessions)))
