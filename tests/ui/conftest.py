"""UI fixtures: JupyterLab and Jupyter server subprocesses, and headless Chromium, stopped by the fixtures.

One JupyterLab serves every module of a test worker (starting one costs 15 to 40 s of CPU on a loaded
machine): `lab` hands it to each module as a fresh lab would look (see JupyterProcess.as_new), so a
test counts and finds only what its module made. A module that needs a lab of other settings (a key,
a database seeded before the server opens it) starts its own.

Chromium is started per module, not per worker: while Playwright's sync API is started it marks its
event loop as the thread's running loop between calls, and asyncio.run() and every pytest-asyncio test
then refuse to run in that process, which the worker's next, non-UI, test file would be."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests import their helpers from wbui.py

from wbui import CHROMIUM, JupyterProcess, artifact, loopback_page, seed_hostile_eval, seed_legacy_session  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test leaves what its page showed and said (keep_failure), in its report as well: a CI
    log then says why, e.g. the sidebar's error banner or a refused request."""
    outcome = yield
    rep = outcome.get_result()
    page = item.funcargs.get("page") if rep.when == "call" and rep.failed else None
    if page is not None and hasattr(page, "said"):
        rep.sections.append(("the page at the failure", keep_failure(page, item.name, page.said)))


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
    """A fresh page that may reach loopback only (wbui.loopback_page)."""
    with loopback_page(browser) as page:
        yield page


def keep_failure(page, name: str, said: list[str]) -> str:
    """What the page showed and said when its test failed, kept as test-artifacts/ui/failed-NAME.png and .txt (the
    sidebar's text, its error banner included, and the page's console, errors and refused requests); returns the
    text, with the token cut out of the URLs."""
    stem = "failed-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:120]
    try:
        page.screenshot(path=str(artifact(f"{stem}.png")))
        sidebar = page.evaluate("document.querySelector('#jp-workbench')?.innerText ?? '(no sidebar)'")
    except Exception as e:  # the page itself is what failed: keep what was said
        sidebar = f"(the page could not be read: {e})"
    text = re.sub(r"token=[^&\s]+", "token=…", f"url: {page.url}\n--- sidebar ---\n{sidebar[-3000:]}\n--- page ---\n"
                  + "\n".join(said[-60:]))
    artifact(f"{stem}.txt").write_text(text + "\n", encoding="utf-8")
    return text
