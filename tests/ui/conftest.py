"""UI fixtures: JupyterLab and Jupyter server subprocesses, and headless Chromium, stopped by the fixtures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests import their helpers from wbui.py

from wbui import CHROMIUM, JupyterProcess  # noqa: E402


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    """A running JupyterLab with the workbench server and lab extensions."""
    proc = JupyterProcess(tmp_path_factory.mktemp("lab"))
    try:
        yield proc.start()
    finally:
        proc.stop()


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
