"""What every benchmark shares: trials, percentiles, a section's result, the machine's description."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

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
