"""Jupyter Enterprise Gateway for the tests: an environment of its own, made once, and a running gateway.

Enterprise Gateway 3.3 pins jupyter_server < 2 and jupyter_client < 7, which the workbench's environment
cannot hold; the workbench only talks to it over HTTP, so it lives in `.venv-eg` beside `.venv` (gitignored),
made from the pins in enterprise-gateway.txt by uv (pip where uv is missing) the first time a test asks for it
and reused after. Several pytest workers may ask at once: a file lock lets one make it while the rest wait.
WORKBENCH_TEST_ENTERPRISE_GATEWAY names another `jupyter-enterprisegateway` to use instead. Where the
environment cannot be made, a test is skipped, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from workbench.testing.jupyter import PortTaken, on_a_free_port

REPO = Path(__file__).resolve().parents[2]
PINS = Path(__file__).with_name("enterprise-gateway.txt")
VENV = REPO / ".venv-eg"
TOKEN = "test-eg-token"


class Unavailable(RuntimeError):
    """No Enterprise Gateway can be had here (the reason says why)."""


def _digest() -> str:
    return hashlib.sha256(PINS.read_bytes()).hexdigest()


def _make(venv: Path) -> None:
    """Make the environment from the pins: uv when it is there and can (seconds), else venv and pip (as
    scripts/test.sh does: uv reads no pip configuration, so an index only pip is told of is pip's to reach)."""
    uv = Path(sys.executable).with_name("uv")
    py = venv / "bin" / "python"
    ways = [[[sys.executable, "-m", "venv", str(venv)],
             [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(PINS)]]]
    if uv.exists():
        ways.insert(0, [[str(uv), "venv", "-q", "--python", sys.executable, str(venv)],
                        [str(uv), "pip", "install", "-q", "--python", str(py), "-r", str(PINS)]])
    failed = []
    for steps in ways:
        shutil.rmtree(venv, ignore_errors=True)
        for cmd in steps:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                failed.append(f"{' '.join(cmd[:3])}: {done.stderr.strip()[-1000:]}")
                break
        else:
            return
    raise Unavailable(f"making {venv.name} failed: " + " | ".join(failed))


def environment() -> Path:
    """The directory of the EG environment's executables (`jupyter-enterprisegateway`, `python`), made if need be."""
    named = os.environ.get("WORKBENCH_TEST_ENTERPRISE_GATEWAY", "")
    if named:
        if not os.access(named, os.X_OK):
            raise Unavailable(f"WORKBENCH_TEST_ENTERPRISE_GATEWAY={named} is not an executable")
        return Path(named).parent
    stamp = VENV / ".pins-sha256"
    with open(REPO / ".venv-eg.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one pytest worker makes it; the others wait here, then reuse it
        try:
            if not (stamp.exists() and stamp.read_text() == _digest()):
                _make(VENV)
                stamp.write_text(_digest())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return VENV / "bin"


def skip_or_fail(pytest, why: str):
    """Skip the test for lack of Enterprise Gateway, but fail it in CI (a fresh clone's CI must run it)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"Enterprise Gateway is required in CI: {why}")
    pytest.skip(f"no Enterprise Gateway here: {why}")


class EnterpriseGateway:
    """A running Enterprise Gateway on 127.0.0.1 with a token; the same face as the kernel gateway fixture's."""

    def __init__(self, root: Path, name: str = "eg", *, time_to_dead: float = 0.3):
        self.root, self.name, self.time_to_dead = root, name, time_to_dead
        self.token, self.url, self.pid = TOKEN, "", 0
        self.proc: subprocess.Popen | None = None
        self.log = root / f"{name}.log"

    def __enter__(self) -> EnterpriseGateway:
        bin_dir = environment()
        runtime = self.root / f"{self.name}-runtime"
        runtime.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ANTHROPIC_", "WORKBENCH_", "JUPYTER_", "PYTHON", "VIRTUAL_ENV"))}
        # its kernels run on its own environment's python and ipykernel (its `python3` kernelspec)
        env.update(JUPYTER_RUNTIME_DIR=str(runtime), JUPYTER_DATA_DIR=str(self.root / f"{self.name}-data"),
                   PATH=str(bin_dir) + os.pathsep + env.get("PATH", ""))
        try:
            return on_a_free_port(lambda port: self._start(bin_dir, env, port))
        except BaseException:
            self.__exit__()
            raise

    def _start(self, bin_dir: Path, env: dict[str, str], port: int) -> EnterpriseGateway:
        """Start EG on `port` and wait for it; PortTaken when another process had taken the port."""
        cmd = [str(bin_dir / "jupyter-enterprisegateway"), "--ip=127.0.0.1", f"--port={port}", "--port_retries=0",
               f"--EnterpriseGatewayApp.auth_token={self.token}",
               "--EnterpriseGatewayApp.unauthorized_users=['nobody']",  # root may start kernels (CI runs as root)
               "--EnterpriseGatewayApp.list_kernels=True",  # the tests look for kernels left on it
               # its restarter is one way a dead kernel is noticed (the hands' probe is the other)
               f"--KernelRestarter.time_to_dead={self.time_to_dead}", "--KernelRestarter.restart_limit=100",
               # its kernels talk to it over Unix sockets in its runtime directory, not TCP ports: jupyter_client 6
               # (EG 3.3's pin) picks a kernel's five ports by binding and letting them go, so on a machine busy
               # with other servers a kernel may find one taken when it binds, die booting, and be restarted on the
               # same ports, while its websocket waits for a kernel_info that never comes (its start then times
               # out; a CI run of test_cli_resume lost minutes to it). jupyter_client 7 has a port cache for this
               "--KernelManager.transport=ipc"]
        with open(self.log, "wb") as log:  # a file, not a pipe nobody reads: a full pipe would stall the gateway
            self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=subprocess.DEVNULL, stderr=log)
        self.pid, self.url = self.proc.pid, f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                self._get("/api")
                return self
            except (OSError, http.client.HTTPException):  # not listening yet, or another process's socket answers
                # (a kernel's ZeroMQ port took it after free_port(): bytes that are not HTTP until the gateway exits)
                if self.proc.poll() is not None:
                    told = self.log.read_text(errors="replace")
                    error = PortTaken if "already in use" in told else RuntimeError
                    raise error("Enterprise Gateway exited: " + told[-2000:]) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("Enterprise Gateway did not answer within 120 s") from None
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _get(self, path: str):
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"token {self.token}"})
        return json.loads(urllib.request.urlopen(req, timeout=5).read())

    def kernels(self, within: float = 120.0) -> list[str]:
        """The ids of the kernels running on the gateway.

        While a kernel is starting, Enterprise Gateway answers this listing with a 500 (jupyter_server's
        `kernel_model` reads `last_activity`, which is set only once the start returns: enterprise_gateway issue
        1395), as right after a host with kernels starting was SIGKILLed: the listing is asked again until the
        starts are over, at most `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            try:
                return [k["id"] for k in self._get("/api/kernels")]
            except urllib.error.HTTPError as e:
                if e.code != 500 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def kernel_pid(self, kernel_id: str) -> int:
        """The pid of the gateway's kernel process `kernel_id` (its connection file names it)."""
        for child in psutil.Process(self.pid).children(recursive=True):
            try:
                if any(kernel_id in a for a in child.cmdline()):
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        raise LookupError(f"no process of kernel {kernel_id} under the gateway")
