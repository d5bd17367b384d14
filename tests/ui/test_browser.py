"""The workbench sidebar in a real JupyterLab, driven in headless Chromium (the system's,
through Playwright; no browser download). Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

from pathlib import Path

import pytest

from wbui import ARTIFACTS, CHROMIUM, JupyterProcess, dream, lab_api

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


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def dream_a_proposal(lab: JupyterProcess, preference: str) -> str:
    """Run a chat turn stating `preference`, dream over it (scripted), return the proposal's id."""
    from workbench.client import WorkbenchClient

    client = WorkbenchClient(lab.url, lab.token)
    try:
        sid = client.ask(preference, model="scripted").session_id
    finally:
        client.close()
    proposals = dream(lab, [sid])
    assert len(proposals) == 1, proposals
    return proposals[0]["id"]


def widen_sidebar(page, dx: int) -> None:
    """Drag the handle between the left area and the main area (for readable screenshots)."""
    box = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + dx, y, steps=5)
    page.mouse.up()


def test_sidebar_session_chat_hands_memories(page, lab: JupyterProcess):
    page.add_init_script(WATCH_STREAMING)
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

    # The Memories tab: nothing proposed yet. Its button opens the full review panel (Panel, in a
    # console of its own); that kernel starts while the chat below goes on.
    panel.get_by_role("tab", name="Memories").click()
    memories = panel.locator(".jp-wb-memories")
    memories.locator(".jp-wb-empty").filter(has_text="No proposals waiting").wait_for()
    memories.get_by_role("button", name="Open the full review panel").click()
    panel.get_by_role("tab", name="Chat").click()

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
    shot(page, "3-interrupted")

    # A dream over a session where the user stated a preference proposes it as a memory.
    memory_id = dream_a_proposal(lab, "Always report temperatures in Celsius.")
    panel.get_by_role("tab", name="Memories").click()
    card = memories.locator(f'.jp-wb-memory[data-memory-id="{memory_id}"]')
    card.filter(has_text="Always report temperatures in Celsius").wait_for()
    shot(page, "4-memories")
    card.get_by_role("button", name="Accept").click()
    card.wait_for(state="detached")
    assert lab_api(lab, "GET", f"memories/{memory_id}")["status"] == "accepted"
    # The full review panel, opened at the start, has rendered in its console.
    review = page.locator(".jp-CodeConsole")
    review.get_by_text("Dream timeline").wait_for(timeout=60_000)
    panel.get_by_role("tab", name="Chat").click()
    review.get_by_text("Dream timeline").scroll_into_view_if_needed()
    shot(page, "5-review-panel")

    # The same sidebar in the dark theme (screenshot only: the styles use theme variables).
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    page.locator("#jupyterlab-splash").wait_for(state="detached")
    shot(page, "6-dark")

    assert page.blocked == [], f"the page tried to reach beyond loopback: {page.blocked[:5]}"
