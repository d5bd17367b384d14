"""The workbench sidebar in a real JupyterLab, driven in headless Chromium (the system's,
through Playwright; no browser download). Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest

from wbui import ARTIFACTS, JupyterProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")

# Records what the chat showed while a reply was still streaming (the live deltas),
# since the committed turn replaces it moments later.
WATCH_STREAMING = """
window.__wbStreamed = '';
new MutationObserver(() => {
  const live = document.querySelector('.jp-wb-assistant.jp-mod-streaming');
  if (live && live.textContent.length > window.__wbStreamed.length) {
    window.__wbStreamed = live.textContent;
  }
}).observe(document, {childList: true, subtree: true, characterData: true});
"""


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

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
def page(browser, lab: JupyterProcess):
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    blocked: list[str] = []

    def only_loopback(route):
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    page.add_init_script(WATCH_STREAMING)
    page.blocked = blocked
    try:
        yield page
    finally:
        context.close()


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def widen_sidebar(page, dx: int) -> None:
    """Drag the handle between the left area and the main area (for readable screenshots)."""
    box = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + dx, y, steps=5)
    page.mouse.up()


def test_sidebar_session_chat_hands_memories(page, lab: JupyterProcess):
    page.goto(f"{lab.url}/lab?token={lab.token}")
    # The sidebar's tab in the left area (the plugin adds it with id jp-workbench).
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=30_000)
    tab.click()
    panel = page.locator("#jp-workbench")
    panel.locator(".jp-wb-composer").wait_for()
    widen_sidebar(page, 170)
    # JupyterLab's news toast is switched off in the test user's settings; dismiss it if it shows anyway.
    news = page.get_by_role("button", name="No")
    if news.count():
        news.first.click()

    panel.get_by_role("button", name="+ New session").click()
    panel.locator(".jp-wb-session.jp-mod-selected").wait_for()
    assert "scripted" in panel.locator(".jp-wb-title").inner_text()

    panel.locator(".jp-wb-input").fill("Please run this:\n```python\nprint(6*7)\n```")
    panel.get_by_role("button", name="Send").click()

    # The tool call shows its code and its output, and the reply is the scripted model's.
    tool = panel.locator(".jp-wb-tool").first
    tool.locator(".jp-wb-stdout").filter(has_text="42").wait_for(timeout=30_000)
    assert "print(6*7)" in tool.locator(".jp-wb-code").inner_text()
    panel.locator(".jp-wb-assistant").filter(has_text="Here is what it printed").wait_for()
    assert "I'll run that in my kernel." in page.evaluate("window.__wbStreamed")
    page.locator(".jp-wb-hands-label[data-generation='1']").wait_for()
    # The turn is over: the composer takes a new message again.
    page.wait_for_function("!document.querySelector('#jp-workbench .jp-wb-composer button').disabled")
    shot(page, "1-chat")

    panel.get_by_role("button", name="Restart hands").click()
    page.locator(".jp-wb-hands-label[data-generation='2']").wait_for(timeout=30_000)
    panel.locator(".jp-wb-note").filter(has_text="hands restarted: generation 2").wait_for()
    shot(page, "2-hands-restarted")

    # A long call, cut off by the interrupt button: the turn ends as interrupted.
    panel.locator(".jp-wb-input").fill("```python\nimport time\ntime.sleep(60)\n```")
    panel.get_by_role("button", name="Send").click()
    panel.locator(".jp-wb-tool.jp-mod-running").wait_for(timeout=30_000)
    panel.get_by_role("button", name="Interrupt").click()
    panel.locator(".jp-wb-note").filter(has_text="turn ended: interrupted").wait_for(timeout=30_000)

    panel.get_by_role("tab", name="Memories").click()
    memories = panel.locator(".jp-wb-memories")
    memories.wait_for()
    # No dream has run on this server: the empty state (or, without the memory routes, a note saying so).
    memories.locator(".jp-wb-empty").filter(has_text=re.compile("No proposals waiting|not available")).wait_for()
    assert memories.get_by_role("link", name="Open the full review panel").count() == 1
    shot(page, "3-memories")

    assert page.blocked == [], f"the page tried to reach beyond loopback: {page.blocked[:5]}"
