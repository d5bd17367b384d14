"""The kernel registry, and the reaper of kernels a crashed host left behind.

Every kernel the workbench starts gets a small JSON file in a registry
directory: its pid and process start time, and the same for its host. A
host that stops cleanly removes its files. A host that was killed cannot,
so the next host calls `reap_orphans()` at start: it kills each registered
kernel whose host is gone, after checking (pid *and* start time) that the
process is still the kernel we started and not a stranger reusing its pid.
A kernel on a gateway is recorded by its id and its gateway's URL; the next
host with that gateway deletes it there (`GatewayLauncher.reap`).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import psutil


def default_registry_dir() -> Path:
    """`workbench-kernels` in the Jupyter runtime dir (per user, not shared with kernels)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "workbench-kernels"


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _same(pid: int | None, started: float | None) -> bool:
    """Whether `pid` is still the process that started at `started`."""
    if not pid or started is None:
        return False
    now = _start_time(pid)
    return now is not None and abs(now - started) < 0.5


def host_alive(entry: dict[str, Any]) -> bool:
    """Whether the host that registered a kernel is still running (its pid, started when it was)."""
    return _same(entry.get("host_pid"), entry.get("host_started"))


class KernelRegistry:
    """One JSON file per running kernel, so a later host can find orphans."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.host_pid = os.getpid()
        self.host_started = _start_time(self.host_pid)
        self._atexit = False

    def add(self, kid: str, pid: int, **info: Any) -> None:
        """Record a started kernel (its pid, start time and host)."""
        if not self._atexit:
            # the last resort when a host exits without closing its hands (no await possible here)
            atexit.register(self.stop_own)
            self._atexit = True
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        entry = {
            "pid": pid,
            "started": _start_time(pid),
            "host_pid": self.host_pid,
            "host_started": self.host_started,
            **info,
        }
        tmp = self.dir / f".{kid}.tmp"
        tmp.write_text(json.dumps(entry))
        tmp.replace(self.dir / f"{kid}.json")

    def remove(self, kid: str) -> None:
        """Forget a kernel that was stopped."""
        try:
            (self.dir / f"{kid}.json").unlink()
        except FileNotFoundError:
            pass

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every registered kernel, by id."""
        out = {}
        for f in sorted(self.dir.glob("*.json")) if self.dir.exists() else []:
            try:
                out[f.stem] = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
        return out


    def stop_own(self) -> list[str]:
        """Kill every kernel this host registered and has not stopped (used at exit)."""
        stopped = []
        for kid, e in self.entries().items():
            if e.get("host_pid") == self.host_pid and _same(e.get("pid"), e.get("started")):
                _stop(kid, e, self, grace=0.2)
                stopped.append(kid)
        return stopped


def _stop(kid: str, e: dict[str, Any], reg: KernelRegistry, grace: float) -> None:
    if _same(e.get("pid"), e.get("started")):
        _kill_tree(e["pid"], grace)
        e["killed"] = True
    # ipykernel exits by itself when its parent dies, but what the model started (a server,
    # a `sleep`) lives on in the kernel's process group; a cgroup, where there is one, gets the rest
    e["strays"] = _kill_group(e.get("pid"), e.get("started"))
    if e.get("cgroup"):
        from ..isolating.limits import cleanup

        cleanup(e["cgroup"])
    if e.get("run_dir"):
        shutil.rmtree(e["run_dir"], ignore_errors=True)
    reg.remove(kid)


def reap_orphans(directory: str | Path | None = None, *, grace: float = 1.0) -> list[dict[str, Any]]:
    """Stop kernels whose host process is gone; returns the entries it handled.

    Call it once when a host (server extension, CLI) starts, with the same
    registry directory its HandsFactory uses (the default when None). Safe
    with other hosts running: kernels of a live host are left alone, and a
    pid is only killed if its start time matches the one recorded, so a
    reused pid is never hit.
    """
    reg = KernelRegistry(Path(directory) if directory else default_registry_dir())
    reaped = []
    for kid, e in reg.entries().items():
        if host_alive(e):
            continue  # its host is alive and will stop it
        if e.get("gateway_url"):
            continue  # a kernel on a gateway: deleted by the next host with that gateway's token (GatewayLauncher.reap)
        _stop(kid, e, reg, grace)
        reaped.append({"id": kid, **e})
    return reaped


def _kill_tree(pid: int, grace: float) -> None:
    """SIGTERM a kernel and its descendants, then SIGKILL what is left after `grace`."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and psutil.pid_exists(pid):
        time.sleep(0.01)


def _kill_group(pgid: int | None, started: float | None) -> int:
    """SIGKILL the processes of a kernel's process group that started after it did; how many."""
    if not pgid or started is None:
        return 0
    strays = []
    for p in psutil.process_iter(["create_time"]):
        try:
            # a later process reusing the number as its group would have started after, too: also
            # require that the group was the kernel's own (it was a session leader)
            if os.getpgid(p.pid) == pgid and p.info["create_time"] >= started - 0.5 and p.pid != os.getpid():
                strays.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    for p in strays:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(strays, timeout=1)
    return len(strays)
