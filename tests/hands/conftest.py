"""Fixtures for the hands tests: real kernels, a real kernel gateway, and an orphan check.

Every temporary file of this test run (kernel run dirs, connection files,
the gateway's runtime dir) lives under one directory, so that at the end
any process whose command line mentions it is a kernel this run left
behind: the check fails the run if there is one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.testing.jupyter import PortTaken, on_a_free_port


TOKEN = "test-gateway-token"


def _leftovers(root: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and any(root in a for a in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture(scope="session")
def hands_tmp():
    """One root for every temp file of this run's hands tests; at the end, no process may mention it."""
    root = tempfile.mkdtemp(prefix="wbhands-")
    try:
        yield Path(root)
    finally:
        left = _leftovers(root)
        _, alive = psutil.wait_procs(left, timeout=3)  # a kernel may still be on its way out
        described = []
        for p in alive:
            try:
                described.append(" ".join(p.cmdline()[:4]))
                p.kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(root, ignore_errors=True)
        assert not described, f"kernel processes outlived the test run: {described}"


@pytest.fixture(autouse=True)
def _temp_under_root(hands_tmp, monkeypatch):
    """Each hands test makes its kernels' run dirs (and subprocesses theirs) under the root."""
    monkeypatch.setenv("TMPDIR", str(hands_tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(hands_tmp))


@pytest.fixture
def settings(tmp_path) -> HandsSettings:
    """Local hands with a registry of their own and a warm pool of one."""
    return HandsSettings(backend="local", pool_size=1, registry_dir=str(tmp_path / "registry"))


class Gateway:
    """A running kernel gateway: its URL and token."""

    def __init__(self, url: str, token: str, pid: int = 0):
        self.url, self.token, self.pid = url, token, pid

    def kernel_pid(self, kernel_id: str) -> int:
        """The pid of the gateway's kernel process `kernel_id` (its connection file names it)."""
        for child in psutil.Process(self.pid).children(recursive=True):
            try:
                if any(kernel_id in a for a in child.cmdline()):
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        raise LookupError(f"no process of kernel {kernel_id} under the gateway")

    def kernels(self) -> list[str]:
        """The ids of the kernels running on the gateway."""
        req = urllib.request.Request(self.url + "/api/kernels", headers={"Authorization": f"token {self.token}"})
        return [k["id"] for k in json.loads(urllib.request.urlopen(req, timeout=5).read())]


@pytest.fixture(scope="session")
def gateway(hands_tmp):
    """A real `jupyter kernelgateway` on 127.0.0.1, stopped at the end."""
    yield from _gateway(hands_tmp, "gateway-runtime", time_to_dead=0.3)


@pytest.fixture(scope="session")
def deaf_gateway(hands_tmp):
    """A kernel gateway whose restarter does not notice a dead kernel for 10 minutes: only the hands' probe can."""
    yield from _gateway(hands_tmp, "deaf-gateway-runtime", time_to_dead=600)


def _gateway(hands_tmp, name: str, time_to_dead: float):
    runtime = hands_tmp / name
    runtime.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
    env.update(JUPYTER_RUNTIME_DIR=str(runtime), KG_AUTH_TOKEN=TOKEN)
    # its log goes to a file: a pipe nobody reads fills after some 64 KiB of log lines, and then the gateway
    # blocks on its next line and answers nothing more (the later gateway tests of a full run timed out)
    log_path = hands_tmp / f"{name}.log"

    def launch(port: int) -> tuple[subprocess.Popen, str]:
        cmd = [
            sys.executable, "-m", "kernel_gateway",
            "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
            "--JupyterWebsocketPersonality.list_kernels=True",
            # the gateway's restarter is one way a dead kernel is noticed over a gateway (the probe is the other)
            f"--KernelRestarter.time_to_dead={time_to_dead}", "--KernelRestarter.restart_limit=100",
        ]  # fmt: skip
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=hands_tmp, env=env, stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request(url + "/api", headers={"Authorization": f"token {TOKEN}"})
                urllib.request.urlopen(req, timeout=2).read()
                return proc, url
            except OSError:
                if proc.poll() is not None:
                    told = log_path.read_text(errors="replace")
                    error = PortTaken if "already in use" in told else RuntimeError
                    raise error("the kernel gateway exited: " + told[-2000:]) from None
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise RuntimeError("the kernel gateway did not answer within 60 s") from None
                time.sleep(0.1)

    proc, url = on_a_free_port(launch)
    try:
        yield Gateway(url, TOKEN, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _enterprise_gateway(hands_tmp, name: str, time_to_dead: float):
    from egsupport import EnterpriseGateway, Unavailable, skip_or_fail

    try:
        gw = EnterpriseGateway(hands_tmp, name, time_to_dead=time_to_dead)
        gw.__enter__()
    except Unavailable as e:
        skip_or_fail(pytest, str(e))
    try:
        yield gw
    finally:
        gw.__exit__()


@pytest.fixture(scope="session")
def enterprise_gateway(hands_tmp):
    """A real Jupyter Enterprise Gateway 3.3 (from its own environment, tests/support/egsupport.py)."""
    yield from _enterprise_gateway(hands_tmp, "eg", 0.3)


@pytest.fixture(scope="session")
def deaf_enterprise_gateway(hands_tmp):
    """An Enterprise Gateway whose restarter does not notice a dead kernel for 10 minutes: only the probe can."""
    yield from _enterprise_gateway(hands_tmp, "deaf-eg", 600)


# the gateways the gateway backend is tested against: the same tests, each gateway a parameter
GATEWAYS = {"gateway": "gateway", "enterprise-gateway": "enterprise_gateway"}
DEAF_GATEWAYS = {"gateway": "deaf_gateway", "enterprise-gateway": "deaf_enterprise_gateway"}


@pytest_asyncio.fixture
async def factory(settings):
    """A started local HandsFactory, closed at the end."""
    f = HandsFactory(settings)
    await f.start()
    try:
        yield f
    finally:
        await f.close()


@pytest.fixture
def recorder():
    """A list of (type, payload) and an event sink that appends to it."""
    events: list[tuple[str, dict]] = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    return events, sink


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def gone():
    """`gone(pids)`: True once none of the pids is a live process (zombies awaiting init count as dead)."""

    def check(pids, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in pids):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    return check
