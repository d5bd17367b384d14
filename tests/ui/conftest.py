"""UI fixtures: JupyterLab and Jupyter server subprocesses, and headless Chromium, stopped by the fixtures.

One JupyterLab serves every module of a test worker (starting one costs 15 to 40 s of CPU on a loaded
machine): `lab` hands it to each module as a fresh lab would look (see JupyterProcess.as_new), so a
test counts and finds only what its module made. A module that needs a lab of other settings (a key,
a database seeded before the server opens it) starts its own.

Chromium is started per module, not per worker: while Playwright's sync API is started it marks its
event loop as the thread's running loop between calls, and asyncio.run() and every pytest-asyncio test
then refuse to run in that process, which the worker's next, non-UI, test file would be."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests import their helpers from wbui.py

from wbui import CHROMIUM, JupyterProcess, seed_hostile_eval, seed_legacy_session  # noqa: E402


@pytest.fixture(scope="session")
def shared_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    """The worker's JupyterLab with the workbench server and lab extensions; its log holds a session an older
    workbench recorded (wbui.LEGACY_SESSION), as a researcher's log may, and an eval run from elsewhere whose names
    carry markup (wbui.HOSTILE_EVAL)."""
    proc = JupyterProcess(tmp_path_factory.mktemp("lab"))
    seed_legacy_session(proc.db)
    seed_hostile_eval(proc.db)
    try:
        yield proc.start()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def lab(shared_lab: JupyterProcess) -> Iterator[JupyterProcess]:
    """A running JupyterLab as a fresh one looks (the worker's, made so); what the module left running stops after it."""
    before = shared_lab.as_new()
    try:
        yield shared_lab
    finally:
        shared_lab.stop_kernels(before)


@pytest.fixture(scope="module")
def browser():
    """The system's Chromium, headless, through Playwright (no browser download)."""
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        pytest.skip("needs the Debian package chromium (scripts/test.sh installs it)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            # Nothing but loopback resolves: an offline CDN fetch fails at once and visibly.
            args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    """A fresh page that may reach loopback only; `page.blocked` lists what it tried beyond."""
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    blocked: list[str] = []

    def only_loopback(route):
        url = route.request.url
        if url.startswith(("data:", "blob:")) or urlparse(url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    page.blocked = blocked
    try:
        yield page
    finally:
        context.close()
