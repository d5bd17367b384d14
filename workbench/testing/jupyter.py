"""A real `jupyter server` (or `jupyter lab`) subprocess for tests and benchmarks.

It listens on a free 127.0.0.1 port with a random token, keeps its runtime,
data and config dirs under `home`, writes its output to a log file, and is
ready once `probe` answers 200. `stop()` is graceful (SIGTERM: Jupyter shuts
its kernels down) and then kills what is left of its process group; `kill()`
SIGKILLs the server alone, as a crash would, leaving its kernels behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import httpx

__all__ = ["JupyterProcess", "PortTaken", "free_port", "loopback_client", "on_a_free_port"]

T = TypeVar("T")

PORT_TAKEN = "could not be started because port"  # what Jupyter's server says when another process took its port
PORT_TRIES = 5


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_client(**kw: Any) -> httpx.Client:
    """An HTTP client for calls to servers on this machine, to be made once and used for many calls: httpx builds an
    SSL context with the CA bundle for each client (some 45 ms of CPU here), which a `httpx.get` per call (a poll
    every fraction of a second) paid again. No connection is kept between calls: a server's port may be another
    server's by the next one."""
    import httpx

    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), **kw)


class PortTaken(RuntimeError):
    """A server exited because another process had taken its port (chosen free) before it bound it."""


def on_a_free_port(start: Callable[[int], T], port: int | None = None) -> T:
    """`start(port)` on `port` (or a free one); when it raises PortTaken, again on another free port, up to
    PORT_TRIES times. A port is free when chosen, but on a loaded machine running many tests another process may
    take it in the seconds before the server binds it; any other failure is raised at once."""
    for attempt in range(PORT_TRIES):
        try:
            return start(port or free_port())
        except PortTaken:
            if attempt == PORT_TRIES - 1:
                raise
            port = None
    raise AssertionError("unreachable")


class JupyterProcess:
    """One Jupyter server subprocess: `start()`, `headers`, `log_tail()`, `kill()`, `stop()`.

    - `app`: the module run with `python -m` (`jupyter_server` or `jupyterlab`).
    - `env`: added to the environment (after `drop_env`, prefixes of inherited variables to leave out).
    - `extensions`: written as the user's `ServerApp.jpserver_extensions` (None: no config file).
    - `args`: extra command-line arguments; `probe`: the path that answers 200 once it is ready.
    """

    def __init__(self, home: Path, *, app: str = "jupyter_server", root: Path | None = None,
                 env: dict[str, str] | None = None, drop_env: tuple[str, ...] = (),
                 extensions: dict[str, bool] | None = None, args: list[str] | None = None,
                 probe: str = "/workbench/api/status", token_prefix: str = "wb-", logfile: Path | None = None,
                 grace: float = 20.0, poll: float = 0.2):
        self.home, self.app, self.port = home, app, free_port()
        self.root = root or home
        self.token = token_prefix + os.urandom(8).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        inherited = {k: v for k, v in os.environ.items() if not (drop_env and k.startswith(drop_env))}
        self.env = {
            **inherited,
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            **(env or {}),
        }
        self.extensions, self.args, self.probe = extensions, list(args or []), probe
        self.logfile = logfile or home / "server.log"
        self.grace, self.poll = grace, poll
        self.proc: subprocess.Popen | None = None
        self.children: list[Any] = []  # kernels seen before a kill(), stopped by stop()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def command(self) -> list[str]:
        """The command line that start() runs."""
        return [
            sys.executable, "-m", self.app, "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
            "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
            "--ServerApp.allow_root=True", *self.args,
        ]

    def start(self, timeout: float = 60.0) -> JupyterProcess:
        """Start the server and wait until `probe` answers; raises with the log's tail if it does not.

        The port was free when it was chosen; another process may take it before the server binds it (seconds
        later, on a loaded machine running many tests). A server that exits because its port is in use is started
        again on another free port (`port` and `url` change), a few times."""
        return on_a_free_port(lambda port: self._start(port, timeout), self.port)

    def _start(self, port: int, timeout: float) -> JupyterProcess:
        import httpx

        self.port, self.url = port, f"http://127.0.0.1:{port}"

        for d in ("runtime", "data", "config"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.extensions is not None:
            # the user-level config wins over the environment's, so this turns extensions on or off
            (self.home / "config" / "jupyter_server_config.json").write_text(
                json.dumps({"ServerApp": {"jpserver_extensions": self.extensions}}))
        size = self.logfile.stat().st_size if self.logfile.exists() else 0
        with open(self.logfile, "ab") as log:
            # own process group: stop() can take the kernels down with the server
            self.proc = subprocess.Popen(self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        with loopback_client(headers=self.headers, timeout=2) as client:  # one for the whole wait
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    said = self.logfile.read_bytes()[size:].decode(errors="replace")
                    error = PortTaken if PORT_TAKEN in said else RuntimeError
                    raise error(f"{self.app} exited with {self.proc.returncode}: {self.log_tail()}")
                try:
                    if client.get(self.url + self.probe).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(self.poll)
        raise RuntimeError(f"{self.app} did not answer in {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        """The last `n` characters of the server's output."""
        return self.logfile.read_text(errors="replace")[-n:] if self.logfile.exists() else ""

    def kill(self) -> None:
        """SIGKILL the server alone: its kernels are left behind, as after a crash (stop() ends them)."""
        if self.proc and self.proc.poll() is None:
            import psutil

            self.children = psutil.Process(self.proc.pid).children(recursive=True)
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (Jupyter runs its shutdown: extensions stop, kernels stop), SIGKILL after `grace`, then its group.

        Not SIGINT: without a terminal, Jupyter answers SIGINT by exiting without its shutdown.
        """
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for child in self.children:
            try:
                child.kill()
            except Exception:  # already gone (reaped by the next server, as it should be)
                pass
        self.children = []
