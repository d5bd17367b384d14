"""Kernels inherit no descriptor of their host: not the server's log, not the user's terminal.

Kernel code lists /proc/self/fd, opens each entry and reads what it can; it must find
only what is its own (sockets, pipes, /dev/null, files under its own directories): never
the file a Jupyter server logs to (with its token in it), never a terminal. Checked
through the real hosts: a `jupyter server` subprocess whose output goes to a file, and
`workbench run` in a pseudo-terminal, for local and for sandboxed hands.
"""

from __future__ import annotations

import json
import os
import pty
import select
import sys
import time
from pathlib import Path

import httpx
import pytest
from wbsupport import WORKBENCH, cli_env

from workbench.hands import Observation
from workbench.hands.isolating import preflight
from workbench.log import DuckDBLog
from workbench.render import result_blocks
from workbench.testing import JupyterProcess

PROBE = r"""
import json, os
from ipykernel import get_connection_file
own = [os.getcwd(), os.environ.get("HOME", ""), os.path.dirname(get_connection_file()), os.environ.get("IPYTHONDIR", "")]
history = str(get_ipython().history_manager.hist_file)  # the session's state directory, beside its workspace
if history != ":memory:":
    own.append(os.path.dirname(history))
fds = {}
for fd in sorted(os.listdir("/proc/self/fd"), key=int):
    path = f"/proc/self/fd/{fd}"
    try:
        target = os.readlink(path)
    except OSError as e:
        continue  # the descriptor listdir itself used, closed by now
    seen = ""
    try:
        f = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            seen = os.read(f, 65536).decode("utf-8", "replace")
        except OSError as e:
            seen = type(e).__name__
        finally:
            os.close(f)
    except OSError as e:
        seen = "open: " + type(e).__name__
    # what it read stays here (it may be megabytes of someone's log): only which telltales were in it,
    # built here so that this cell's source (in the session's history file) does not hold them
    telltales = ["tok" + "en=", " ".join(["typed", "by", "the", "user"])]
    fds[fd] = [target, len(seen), [m for m in telltales if m in seen]]
print(json.dumps({"own": [p for p in own if p], "fds": fds}))
"""

FD_WRITES = r"""
import ctypes, os
os.system("echo fd-level-" + "shell")
line = ("fd-level-" + "c-write\n").encode()
ctypes.CDLL(None).write(2, line, len(line))
"""

ALWAYS_OURS = ("socket:", "pipe:", "anon_inode:", "/dev/null", "/dev/urandom")
TERMINALS = ("/dev/pts/", "/dev/tty", "/dev/console", "/dev/ptmx")


def backends() -> list:
    check = preflight()
    sandbox = pytest.param("sandbox", marks=pytest.mark.skipif(not check.ok, reason=f"no working bubblewrap: {check.reason}"))
    return ["local", sandbox]


def strangers(report: dict) -> list[str]:
    """The kernel's descriptors that are not its own, or through which it read the host's log or terminal."""
    own = [p.rstrip("/") + "/" for p in report["own"] if p.strip("/")]  # never "/": that would be every path
    bad = []
    for fd, (target, _, telltales) in report["fds"].items():
        ours = target.startswith(ALWAYS_OURS) or any(target.startswith(p) for p in own)
        if not ours or target.startswith(TERMINALS) or telltales:
            bad.append(f"fd {fd} -> {target} (read: {telltales})")
    return bad


def probe_result(events: list) -> dict:
    result = next(e for e in events if e.type == "tool_result")
    assert not result.payload["is_error"], result_blocks(result.payload)
    return json.loads(Observation.from_json(result.payload["observation"]).stdout)


@pytest.mark.parametrize("backend", backends())
def test_under_a_jupyter_server_logging_to_a_file(tmp_path, backend):
    home = tmp_path / "jp"
    db = tmp_path / "log.duckdb"
    others = ("jupyterlab", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals", "panel.io.jupyter_server_extension",
              "notebook")
    server = JupyterProcess(home, env={"HOME": str(home), "WORKBENCH_DB": str(db), "WORKBENCH_HANDS_POOL_SIZE": "0",
                                       "WORKBENCH_HANDS_BACKEND": backend},
                            drop_env=("ANTHROPIC_", "WORKBENCH_"), extensions={**dict.fromkeys(others, False), "workbench": True})
    server.start()
    with open(server.logfile, "a") as log:  # the server's own log lines hold its URL; make sure a token is in it
        log.write(f"[I canary] http://127.0.0.1:{server.port}/lab?token={server.token}\n")
    try:
        api = server.url + "/workbench/api"
        with httpx.Client(headers=server.headers, timeout=30) as http:
            sid = http.post(api + "/sessions", json={"model": "scripted"}).raise_for_status().json()["id"]
            http.post(f"{api}/sessions/{sid}/messages", json={"text": f"```python\n{PROBE}\n```"}).raise_for_status()
            deadline = time.monotonic() + 120
            while True:
                events = http.get(f"{api}/sessions/{sid}/events").raise_for_status().json()["events"]
                if any(e["type"] == "turn_ended" for e in events):
                    break
                assert time.monotonic() < deadline, f"the turn did not end: {server.log_tail()}"
                time.sleep(0.2)
            # what the kernel writes to its descriptors 1 and 2 below Python (a shell command, C code) is
            # output of the call: it reaches the observation, never the server's log
            http.post(f"{api}/sessions/{sid}/messages", json={"text": f"```python\n{FD_WRITES}\n```"}).raise_for_status()
            while True:
                events = http.get(f"{api}/sessions/{sid}/events").raise_for_status().json()["events"]
                if sum(e["type"] == "turn_ended" for e in events) == 2:
                    break
                assert time.monotonic() < deadline + 120, f"the turn did not end: {server.log_tail()}"
                time.sleep(0.2)
    finally:
        server.stop()
    result, fd_result = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert not result["is_error"], result_blocks(result)
    report = json.loads(Observation.from_json(result["observation"]).stdout)
    log_target = str(server.logfile.resolve())
    assert not [t for t, *_ in report["fds"].values() if t == log_target]
    assert strangers(report) == []
    shown = result_blocks(fd_result)[0]["text"]
    assert "fd-level-" + "shell" in shown and "fd-level-" + "c-write" in shown, result_blocks(fd_result)
    assert "fd-level-" not in server.logfile.read_text(errors="replace")


def _drain(fd: int, sink: bytearray) -> bool:
    """Read what the terminal shows; False once the other side is closed."""
    try:
        data = os.read(fd, 65536)
    except OSError:
        return False
    sink += data
    return bool(data)


@pytest.mark.parametrize("backend", backends())
def test_under_workbench_run_in_a_terminal(tmp_path, backend):
    db = tmp_path / "log.duckdb"
    env = cli_env(WORKBENCH_HANDS_POOL_SIZE="0", WORKBENCH_HANDS_BACKEND=backend, TERM="xterm")
    argv = [*WORKBENCH, "run", f"```python\n{PROBE}\n```", "--model", "scripted", "--db", str(db)]
    pid, master = pty.fork()  # the child's stdin, stdout, stderr and controlling terminal: a new pty
    if pid == 0:
        try:
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    shown = bytearray()
    try:
        os.write(master, b"typed by the user\n")  # what a kernel holding the terminal could read
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0] and not _drain(master, shown):
                break
        status = os.waitpid(pid, 0)[1]
    finally:
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 0, shown.decode(errors="replace")[-2000:]
    with DuckDBLog(db, read_only=True) as log:
        report = probe_result(log.events(log.sessions()[0]["id"]))
    assert strangers(report) == []
    assert Path(report["fds"]["0"][0]).as_posix() == "/dev/null"
