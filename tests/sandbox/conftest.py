"""Fixtures for the sandbox tests: real bubblewrap kernels, a real recording HTTP server."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import uuid
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from workbench.egress import EgressSettings, Vault
from workbench.hands import HandsConfig, KernelHands
from workbench.hands.isolating import preflight
from workbench.hands.launching import SandboxLauncher

from upstream import Upstream

_CHECK = preflight()
needs_sandbox = pytest.mark.skipif(not _CHECK.ok, reason=f"no working bubblewrap here: {_CHECK.reason}")


@pytest.fixture
def upstream():
    with Upstream() as u:
        yield u


@pytest.fixture
def bystander():
    """A loopback service kernel code must never reach (stands in for the Jupyter server)."""
    with Upstream(b"jupyter server\n") as u:
        yield u


@pytest.fixture
def secret() -> str:
    return "sk-canary-" + secrets.token_hex(12)


@pytest.fixture
def vault_file(tmp_path, upstream, secret) -> Path:
    """A real vault file, mode 0600, with one credential for the upstream server."""
    p = tmp_path / "vault.json"
    p.write_text(json.dumps({"credentials": {"example": {
        "value": secret, "hosts": [f"127.0.0.1:{upstream.port}"], "header": "Authorization", "format": "Bearer {value}",
    }}}))
    p.chmod(0o600)
    return p


def processes_with(mark: str) -> list[int]:
    """Host pids whose command line or environment carries `mark` (bwrap, the kernel, socat)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if mark.encode() in (d / "cmdline").read_bytes() + (d / "environ").read_bytes():
                found.append(int(d.name))
        except OSError:
            pass
    return found


async def no_process_left(mark: str, within: float = 5.0) -> None:
    """Wait until no process carries `mark` (a killed pid namespace empties quickly); fail if one stays."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (left := processes_with(mark)) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert not left, f"processes outlived the test: {left}"


def tree(pid: int | None) -> list[psutil.Process]:
    """A process and everything under it (bwrap, the kernel, socat), to check they are gone later."""
    if pid is None:
        return []
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


async def all_gone(procs: list[psutil.Process], within: float = 5.0) -> None:
    """Fail unless every process of `procs` has ended."""
    _, alive = await asyncio.to_thread(psutil.wait_procs, procs, within)
    assert not alive, f"processes outlived the test: {alive}"


@pytest_asyncio.fixture
async def make_hands(tmp_path):
    """make(egress=, vault=, allow_private=) -> (hands, events); every kernel is stopped and checked gone."""
    made: list[tuple[KernelHands, str]] = []
    launchers: list[SandboxLauncher] = []

    async def make(egress=None, vault: Vault | None = None, allow_private: str = ""):
        events: list[tuple[str, dict]] = []

        async def sink(type: str, payload: dict) -> None:
            events.append((type, payload))

        mark = "wbmark" + uuid.uuid4().hex
        work = tmp_path / f"work-{len(made)}"
        launcher = SandboxLauncher(vault=vault, egress_settings=EgressSettings(egress_allow_private=allow_private))
        launchers.append(launcher)
        hands = KernelHands(HandsConfig(workdir=str(work), env={"WB_TEST_MARK": mark}), launcher=launcher, on_event=sink,
                            session_config={"egress": egress})
        made.append((hands, mark))
        return hands, events

    try:
        yield make
    finally:
        for hands, mark in made:
            await hands.shutdown()
            await no_process_left(mark)
        for launcher in launchers:
            await launcher.aclose()


async def run(hands: KernelHands, code: str) -> str:
    """Run code in the hands; it must succeed; returns its text."""
    obs = await hands.execute(code, timeout=30)
    assert obs.ok, obs.text()
    return obs.text()
