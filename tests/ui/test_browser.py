"""The workbench sidebar in a real JupyterLab, driven in headless Chromium (the system's,
through Playwright; no browser download). Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import re

import pytest

from wbui import CHROMIUM, JupyterProcess, dream, lab_api, shot

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
    news = page.get_by_role("button", name="No", exact=True)
    if news.count():
        news.first.click()

    # The Memories tab: nothing proposed yet. Its button opens the full review panel in the main area.
    panel.get_by_role("tab", name="Memories").click()
    memories = panel.locator(".jp-wb-memories")
    memories.locator(".jp-wb-empty").filter(has_text="No proposals waiting").wait_for()
    memories.get_by_role("button", name="Open the full review panel").click()
    panel.get_by_role("tab", name="Chat").click()

    panel.get_by_role("button", name="+ New session").click()
    panel.locator(".jp-wb-session.jp-mod-selected").wait_for()
    sid = panel.locator(".jp-wb-session.jp-mod-selected").get_attribute("data-session-id")
    assert "scripted" in panel.locator(".jp-wb-title").inner_text()

    # The message's first POST reaches the server, but its answer is lost (a dropped connection): the sidebar
    # sends it again with the same idempotency key, and the server records it once.
    sent: list = []

    def lose_first_answer(route) -> None:
        sent.append(route.request.post_data_json)
        if len(sent) == 1:
            route.fetch()  # the server records the message and answers...
            route.abort("connectionreset")  # ...and the answer never arrives
        else:
            route.continue_()

    messages_route = re.compile(r"/workbench/api/sessions/[^/?]+/messages(\?|$)")  # JupyterLab adds a cache-buster
    page.route(messages_route, lose_first_answer)
    panel.locator(".jp-wb-input").fill("Please run this:\n```python\nprint(6*7)\n```")
    panel.get_by_role("button", name="Send").click()

    # The tool call shows its code and its output, and the reply is the scripted model's.
    tool = panel.locator(".jp-wb-tool").first
    tool.locator(".jp-wb-stdout").filter(has_text="42").wait_for(timeout=30_000)
    assert "print(6*7)" in tool.locator(".jp-wb-code").inner_text()
    panel.locator(".jp-wb-assistant").filter(has_text="Here is what it printed").wait_for()
    assert "I'll run that in my kernel." in page.evaluate("window.__wbStreamed")
    page.locator(".jp-wb-hands-label[data-generation='1']").wait_for()
    # The turn is over: the composer's Stop is Send again.
    page.wait_for_function("document.querySelector('#jp-workbench .jp-wb-send').textContent === 'Send'")
    shot(page, "1-chat")
    page.unroute(messages_route)
    assert len(sent) == 2 and sent[0] == sent[1] and len(sent[0]["idempotency_key"]) == 32, sent
    messages = [e for e in lab_api(lab, "GET", f"sessions/{sid}/events")["events"] if e["type"] == "user_message"]
    assert [m["payload"]["idempotency_key"] for m in messages] == [sent[0]["idempotency_key"]]

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
    # its text rendered as Markdown (as the review panel renders it); its source a link, named by the session's
    # title once known, that opens the session at the cited event
    card.locator(".jp-wb-memory-text .jp-wb-markdown").wait_for()
    source = card.locator("a.jp-wb-review-source").first
    source.filter(has_text="“").wait_for(timeout=30_000)  # the title replaced the hex id
    cited = source.get_attribute("data-session-id")
    assert cited and "#" not in source.inner_text().split("·")[0], source.inner_text()
    shot(page, "4-memories")
    source.click()
    panel.locator(f".jp-wb-session[data-session-id='{cited}'][aria-selected='true']").wait_for(timeout=30_000)
    panel.get_by_role("tab", name="Memories").click()
    card.get_by_role("button", name="Accept").click()
    card.wait_for(state="detached")
    assert lab_api(lab, "GET", f"memories/{memory_id}")["status"] == "accepted"
    # The full review panel, opened at the start, shows the accepted memory (live: no reload).
    review = page.locator("#jp-workbench-review")
    review.locator("select.jp-wb-review-status").select_option("accepted")
    review.locator(f'.jp-wb-review-card[data-memory-id="{memory_id}"]').wait_for(timeout=30_000)
    panel.get_by_role("tab", name="Chat").click()
    shot(page, "5-review-panel")

    # The same sidebar in the dark theme (screenshot only: the styles use theme variables).
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    page.locator("#jupyterlab-splash").wait_for(state="detached")
    shot(page, "6-dark")

    assert page.blocked == [], f"the page tried to reach beyond loopback: {page.blocked[:5]}"


# Records when each `tick i t` line first shows in a running call's live output (Date.now, in seconds).
WATCH_LIVE = """
window.__wbTicks = {};
new MutationObserver(() => {
  for (const pre of document.querySelectorAll('.jp-wb-live')) {
    for (const m of pre.textContent.matchAll(/tick (\\d+) (\\d+\\.\\d+)/g)) {
      if (!(m[1] in window.__wbTicks)) {
        window.__wbTicks[m[1]] = [Date.now() / 1000, parseFloat(m[2])];
      }
    }
  }
}).observe(document, {childList: true, subtree: true, characterData: true});
"""

LOOP = "```python\nimport time\nprint('<img src=x onerror=\"window.__pwned = 1\">', flush=True)\nfor i in range(300):\n    print(f'tick {i} {time.time():.3f}', flush=True)\n    time.sleep(1)\n```"


def open_sidebar(page, lab: JupyterProcess):
    page.goto(f"{lab.url}/lab?token={lab.token}")
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=30_000)
    panel = page.locator("#jp-workbench")
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=30_000)
    if not panel.locator(".jp-wb-composer").is_visible():  # a reload restores the sidebar as it was
        tab.click()
    panel.locator(".jp-wb-composer").wait_for()
    return panel


def test_a_long_loop_streams_into_its_tool_card_and_survives_a_reload(page, lab: JupyterProcess):
    """A five-minute loop, interrupted once its output has come through a reload: a loop that ended before the
    reloaded page was ready (a loaded machine) would leave no running card to check."""
    page.add_init_script(WATCH_LIVE)
    panel = open_sidebar(page, lab)
    panel.get_by_role("button", name="+ New session").click()
    panel.locator(".jp-wb-session.jp-mod-selected").wait_for()
    panel.locator(".jp-wb-input").fill(LOOP)
    panel.get_by_role("button", name="Send").click()

    page.wait_for_function("['0', '1', '2'].every(i => i in window.__wbTicks)", timeout=60_000)
    ticks = page.evaluate("window.__wbTicks")
    lags = {i: shown - printed for i, (shown, printed) in ticks.items()}
    assert max(lags.values()) < 5.0, f"lines showed in the sidebar this long after their print: {lags}"
    card = panel.locator(".jp-wb-tool.jp-mod-running").first
    assert card.locator(".jp-wb-live-status").get_attribute("data-hands") == "busy"
    assert "hands busy" in card.locator(".jp-wb-live-status").inner_text()
    page.locator(".jp-wb-hands-label[data-state='busy']").wait_for()
    shot(page, "7-live-output")
    assert "<img src=x" in card.locator(".jp-wb-live").inner_text(), "printed markup shows as text"
    assert page.evaluate("window.__pwned === undefined"), "printed markup never runs"

    # A reload mid-call: the new page's websocket gets the output so far, then the rest as it comes.
    sid = panel.locator(".jp-wb-session.jp-mod-selected").get_attribute("data-session-id")
    page.reload()
    panel = open_sidebar(page, lab)
    session = panel.locator(f'.jp-wb-session[data-session-id="{sid}"]')
    if "jp-mod-selected" not in (session.get_attribute("class") or ""):
        session.click()
    card = panel.locator(".jp-wb-tool.jp-mod-running").first
    card.locator(".jp-wb-live").filter(has_text="tick 0 ").wait_for(timeout=30_000)
    before = page.evaluate("Object.keys(window.__wbTicks).length")
    page.wait_for_function(f"Object.keys(window.__wbTicks).length > {before}", timeout=30_000)
    text = card.locator(".jp-wb-live").inner_text()
    shown = [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]
    assert shown == list(range(len(shown))) and len(shown) > before, "the output so far, then more, nothing twice"
    panel.get_by_role("button", name="Interrupt").click()
    panel.locator(".jp-wb-note").filter(has_text="turn ended: interrupted").wait_for(timeout=30_000)
    assert page.blocked == []
