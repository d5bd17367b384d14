"""The sidebar at JupyterLab's default width, and a session's chat in a main-area tab (issue 25, item 4), in a
real JupyterLab driven in headless Chromium. Each numbered symptom of the issue is measured in the DOM: font sizes
and families against JupyterLab's own variables, the header's height, the hands status on one line, the composer's
placeholder not cut off, code not wrapped, an output image readable. Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import httpx
import pytest
from wbui import CHROMIUM, JupyterProcess, lab_api, new_session, open_sidebar, send, shot, wait_idle

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")

# The px a JupyterLab variable comes to on an element whose parent is at --jp-ui-font-size1 (the panel's size).
VAR_PX = """(name) => {
  const outer = document.createElement('div');
  outer.style.fontSize = 'var(--jp-ui-font-size1)';
  const probe = document.createElement('span');
  probe.style.fontSize = `var(${name})`;
  probe.style.fontFamily = 'var(--jp-ui-font-family)';
  outer.append(probe);
  document.body.append(outer);
  const cs = getComputedStyle(probe);
  const out = {px: parseFloat(cs.fontSize), family: cs.fontFamily};
  outer.remove();
  return out;
}"""

# Every element of `root` that shows text of its own: its font size, family and a name to report it by.
TEXT_FONTS = """(root) => {
  const out = [];
  for (const el of root.querySelectorAll('*')) {
    if (!el.getClientRects().length) continue;
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    const control = ['INPUT', 'SELECT', 'TEXTAREA', 'BUTTON'].includes(el.tagName)
      && !['checkbox', 'radio'].includes(el.type) && (el.tagName !== 'BUTTON' || el.textContent.trim());
    if (!own && !control) continue;
    if (el.closest('pre, code, .jp-wb-log')) continue;  // code is in the code font; the log is checked apart
    const cs = getComputedStyle(el);
    out.push({what: `${el.tagName.toLowerCase()}.${[...el.classList].join('.')}`,
              px: parseFloat(cs.fontSize), family: cs.fontFamily});
  }
  return out;
}"""

# The composer's placeholder laid out as the box lays it out, on one line: its width against the box's.
PLACEHOLDER_FITS = """(ta) => {
  const cs = getComputedStyle(ta, '::placeholder');
  const mirror = document.createElement('span');
  mirror.textContent = ta.placeholder;
  Object.assign(mirror.style, {position: 'absolute', visibility: 'hidden', whiteSpace: 'nowrap',
    font: getComputedStyle(ta).font, letterSpacing: cs.letterSpacing});
  document.body.append(mirror);
  const pad = parseFloat(getComputedStyle(ta).paddingLeft) + parseFloat(getComputedStyle(ta).paddingRight);
  const out = {scrollWidth: mirror.scrollWidth, clientWidth: ta.clientWidth - pad, text: ta.placeholder};
  mirror.remove();
  return out;
}"""

# A pre's lines as drawn: how many line boxes its text takes, how many lines it has, and whether it scrolls.
PRE_LINES = """(pre) => {
  const range = document.createRange();
  range.selectNodeContents(pre);
  const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
  return {drawn: tops.size, lines: pre.textContent.replace(/\\n$/, '').split('\\n').length,
          scrolls: pre.scrollWidth > pre.clientWidth, overflowX: getComputedStyle(pre).overflowX,
          width: pre.clientWidth};
}"""

LONG = "x = 'abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789'"
# A 420 x 140 PNG of its natural size (no matplotlib margins to guess): wider than the sidebar, narrower than a tab.
WIDE_IMAGE = ("```python\nimport io, numpy as np\nfrom PIL import Image\nfrom IPython.display import display, Image as Png\n"
              "a = np.zeros((140, 420, 3), 'uint8'); a[:, ::20] = 255\nb = io.BytesIO(); Image.fromarray(a).save(b, 'PNG')\n"
              "display(Png(data=b.getvalue()))\n```")


def test_the_sidebar_is_calm_at_the_default_width(page, lab: JupyterProcess):
    """Each symptom is checked and every one that shows is reported together (the old sidebar had them all)."""
    problems: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    panel = open_sidebar(page, lab)
    width = panel.evaluate("el => el.getBoundingClientRect().width")
    default = page.evaluate("parseFloat(getComputedStyle(document.body).getPropertyValue('--jp-sidebar-min-width'))")
    check(width <= default + 30, f"(0) the sidebar opened {width} px wide, JupyterLab's default is {default} px")
    new_session(panel)
    page.locator("#jp-workbench .jp-wb-hands-label[data-generation]").wait_for(timeout=60_000)
    size0 = page.evaluate(VAR_PX, "--jp-ui-font-size0")
    size1 = page.evaluate(VAR_PX, "--jp-ui-font-size1")

    # (1) The search box and the pickers are at the panel's size, in JupyterLab's UI font (not 15.6 px Arial).
    for sel in (".jp-wb-search", ".jp-wb-model", ".jp-wb-effort", ".jp-wb-thinking", ".jp-wb-input"):
        font = panel.locator(sel).evaluate("el => ({px: parseFloat(getComputedStyle(el).fontSize),"
                                           " family: getComputedStyle(el).fontFamily})")
        check(font == {"px": size1["px"], "family": size1["family"]}, f"(1) {sel}: {font}, not {size1}")
    # ... and no text in the sidebar outside the chat is smaller than --jp-ui-font-size0, or in another font.
    fonts = panel.evaluate(TEXT_FONTS)
    assert fonts, "the sidebar shows text"
    small = [f for f in fonts if f["px"] < size0["px"] - 0.01]
    check(not small, f"(1) text smaller than --jp-ui-font-size0 ({size0['px']} px): {small}")
    other = [f for f in fonts if f["family"] != size1["family"]]
    check(not other, f"(1) text not in --jp-ui-font-family: {other}")

    # (2) The hands status: readable, one line, cut with an ellipsis and whole in its tooltip.
    status = panel.locator(".jp-wb-hands-label")
    st = status.evaluate("el => ({px: parseFloat(getComputedStyle(el).fontSize), h: el.getBoundingClientRect().height,"
                         " lh: parseFloat(getComputedStyle(el).lineHeight) || parseFloat(getComputedStyle(el).fontSize) * 1.4,"
                         " ws: getComputedStyle(el).whiteSpace, to: getComputedStyle(el).textOverflow,"
                         " text: el.textContent, title: el.title})")
    check(st["px"] >= size0["px"] - 0.01, f"(2) the hands status is {st['px']} px")
    check(st["ws"] == "nowrap" and st["to"] == "ellipsis" and st["h"] < 1.6 * st["lh"], f"(2) not one line: {st}")
    check(st["text"].startswith("hands ") and st["title"] == st["text"], f"(2) no tooltip: {st}")

    # (3) A compact header: the selected session's header is two short lines, not half the sidebar.
    head = panel.locator(".jp-wb-session-head").evaluate("el => el.getBoundingClientRect().height")
    whole = panel.evaluate("el => el.getBoundingClientRect().height")
    check(head <= 4 * size1["px"] + 16 and head < 0.1 * whole, f"(3) header {head} px of a {whole} px sidebar")

    # (4) The composer's placeholder is not cut off.
    ph = panel.locator(".jp-wb-input").evaluate(PLACEHOLDER_FITS)
    check(bool(ph["text"]) and ph["scrollWidth"] <= ph["clientWidth"], f"(4) placeholder cut: {ph}")

    # (5) Code keeps its lines and scrolls sideways, in a tool card and in a message's fenced block.
    send(panel, f"```python\n{LONG}\nprint(len(x))\n```")
    tool = panel.locator(".jp-wb-tool").first
    tool.locator(".jp-wb-stdout").filter(has_text="72").wait_for(timeout=60_000)
    for pre in (tool.locator("pre.jp-wb-code"), panel.locator(".jp-wb-user pre").first):
        lines = pre.evaluate(PRE_LINES)
        check(lines["drawn"] == lines["lines"] == 2 and lines["scrolls"] and lines["overflowX"] == "auto",
              f"(5) code wrapped: {lines}")
    log = panel.locator(".jp-wb-log").evaluate("el => el.getBoundingClientRect().height")
    check(log > 0.4 * whole, f"(3) the chat has {log} px of a {whole} px sidebar")
    wait_idle(page)

    # (6) An image wider than the chat fits it, and a click shows it at its natural size (the output scrolls).
    send(panel, WIDE_IMAGE)
    img = panel.locator(".jp-wb-tool").filter(has_text="Png(data").locator(".jp-wb-output img").first
    img.wait_for(timeout=60_000)
    page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle())
    fit = img.evaluate("el => [el.naturalWidth, el.clientWidth, el.closest('.jp-wb-log').clientWidth]")
    check(fit[0] == 420 and fit[1] <= fit[2], f"(6) the image does not fit: {fit}")
    img.click()
    full = img.evaluate("el => [el.clientWidth, el.closest('.jp-wb-mime').scrollWidth > el.closest('.jp-wb-mime').clientWidth]")
    check(full == [420, True], f"(6) a click does not show the image at its natural size: {full}")
    img.click()
    check(img.evaluate("el => el.clientWidth") == fit[1], "(6) a second click does not fit it again")
    wait_idle(page)
    shot(page, "layout-sidebar-light")
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    shot(page, "layout-sidebar-dark")
    assert not problems, "\n".join(problems)
    assert page.blocked == []


def test_a_session_opens_as_a_chat_in_the_main_area(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    send(panel, f"Main area check\n```python\n{LONG}\nprint(len(x))\n```")
    panel.locator(".jp-wb-assistant").filter(has_text="Here is what it printed").wait_for(timeout=60_000)
    wait_idle(page)
    title = lab_api(lab, "GET", f"sessions/{sid}")["title"] or sid

    # The header's button opens it in a tab of the main area, titled by the session's title.
    panel.get_by_role("button", name="Open the chat in the main area").click()
    tab = page.locator(".jp-wb-chattab .jp-wb-chatarea")
    tab.wait_for()
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").filter(has_text=title).wait_for()
    # It shows the session so far: the same chat, with room (code unwrapped and not squeezed).
    tab.locator(".jp-wb-tool .jp-wb-stdout").filter(has_text="72").wait_for(timeout=30_000)
    assert tab.locator(".jp-wb-user").first.inner_text().startswith("Main area check")
    code = tab.locator(".jp-wb-tool pre.jp-wb-code").first.evaluate(PRE_LINES)
    assert code["drawn"] == code["lines"] == 2 and not code["scrolls"], code
    tab.locator(".jp-wb-hands-label[data-generation]").wait_for(timeout=30_000)

    # A message sent from the tab shows in the tab and in the sidebar, live; and one sent from the sidebar in both.
    tab.locator(".jp-wb-input").fill("From the tab\n```python\nprint('tab' * 2)\n```")
    tab.get_by_role("button", name="Send").click()
    for where in (tab, panel):
        where.locator(".jp-wb-stdout").filter(has_text="tabtab").wait_for(timeout=60_000)
    page.wait_for_function("document.querySelector('.jp-wb-chatarea .jp-wb-send').textContent === 'Send'",
                           timeout=60_000)
    wait_idle(page)
    send(panel, "From the sidebar\n```python\nprint('side' * 2)\n```")
    tab.locator(".jp-wb-stdout").filter(has_text="sideside").wait_for(timeout=60_000)
    wait_idle(page)
    texts = [e["payload"]["text"] for e in lab_api(lab, "GET", f"sessions/{sid}/events")["events"]
             if e["type"] == "user_message"]
    assert len(texts) == 3 and texts[1].startswith("From the tab") and texts[2].startswith("From the sidebar"), texts

    # An image at its natural size in the tab, where there is room.
    tab.locator(".jp-wb-input").fill(WIDE_IMAGE)
    tab.get_by_role("button", name="Send").click()
    img = tab.locator(".jp-wb-output img").first
    img.wait_for(timeout=60_000)
    page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle())
    assert img.evaluate("el => [el.naturalWidth, el.clientWidth]") == [420, 420]
    page.wait_for_function("document.querySelector('.jp-wb-chatarea .jp-wb-send').textContent === 'Send'",
                           timeout=60_000)
    shot(page, "layout-chat-tab-light")

    # Opening it again brings the same tab forward; another session gets a tab of its own (the context menu).
    assert page.evaluate(f"window.jupyterapp.commands.execute('workbench:open-chat-tab', {{id: '{sid}'}})"
                         ".then(() => document.querySelectorAll('.jp-wb-chattab').length)") == 1
    other = new_session(panel)
    panel.locator(f'.jp-wb-session[data-session-id="{other}"]').click(button="right")
    # the list drawn anew while the menu is open (as when a session changes meanwhile): the row right-clicked is
    # replaced by a new one, and the menu still opens the session it was opened on
    page.evaluate("[...window.jupyterapp.shell.widgets('left')].find(w => w.id === 'jp-workbench').render()")
    page.locator(".lm-Menu-item").filter(has_text="Open the chat in the main area").click()
    try:
        page.wait_for_function("(id) => [...window.jupyterapp.shell.widgets('main')]"
                               ".some(w => w.hasClass('jp-wb-chattab') && w.content.sessionId === id)", arg=other,
                               timeout=60_000)
    finally:
        shot(page, "layout-context-menu")
    assert page.locator(".jp-wb-chattab").count() == 2
    palette = page.evaluate("window.jupyterapp.commands.label('workbench:open-chat-tab', {})")
    assert palette == "Open the Workbench chat in the main area"

    # A reload restores both tabs (JupyterLab's layout restorer), each with its session: once the workspace
    # the page saves (debounced) holds them.
    workspace = page.url.split("/lab/workspaces/")[1].split("?")[0]
    deadline = time.monotonic() + 60
    while not all(f"workbench-chat:{s}" in httpx.get(f"{lab.url}/lab/api/workspaces/{workspace}",
                                                      headers=lab.headers, timeout=30).text for s in (sid, other)):
        assert time.monotonic() < deadline, "the workspace never held the chat tabs"
        page.wait_for_timeout(250)
    page.reload()
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=60_000)
    page.locator(".jp-wb-chattab").nth(1).wait_for(state="attached", timeout=60_000)
    ids = page.evaluate("[...window.jupyterapp.shell.widgets('main')].filter(w => w.hasClass('jp-wb-chattab'))"
                        ".map(w => w.content.sessionId).sort()")
    assert ids == sorted([sid, other]), ids
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    page.evaluate(f"window.jupyterapp.commands.execute('workbench:open-chat-tab', {{id: '{sid}'}})")
    page.locator(".jp-wb-chatarea:visible .jp-wb-stdout").filter(has_text="sideside").wait_for(timeout=30_000)
    # A restored tab shows the end of its chat (its messages grew as they rendered, after they were added).
    page.wait_for_function("(() => { const n = document.querySelector('.jp-wb-chattab:not(.lm-mod-hidden) .jp-wb-log');"
                           " return n && n.scrollTop > 0 && n.scrollTop + n.clientHeight >= n.scrollHeight - 8; })()",
                           timeout=30_000)
    shot(page, "layout-chat-tab-dark")

    # A tab for a session that does not exist says so and sends nothing; an id that is a path reaches no other route.
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/workbench/api/" in r.url else None)
    for bad in ("no-such-session", "../memories", "x?y=1#z"):
        page.evaluate("(id) => window.jupyterapp.commands.execute('workbench:open-chat-tab', {id})", bad)
        page.locator(".jp-wb-chatarea:visible .jp-wb-banner").filter(has_text="no longer exists").wait_for()
        assert page.locator(".jp-wb-chatarea:visible .jp-wb-send").is_disabled()
    paths = [urlparse(u).path for u in requests]
    assert not [p for p in paths if p.endswith(("/workbench/api/memories", "/sessions/x"))], paths
    # A title that is markup is the tab's text, never HTML.
    evil = lab_api(lab, "POST", "sessions", {"title": '<img src=x onerror="window.__pwned=1">'})["id"]
    page.evaluate("(id) => window.jupyterapp.commands.execute('workbench:open-chat-tab', {id})", evil)
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").filter(has_text="<img src=x").wait_for()
    page.locator(".jp-wb-chatarea:visible .jp-wb-title").filter(has_text="<img src=x").wait_for()
    assert page.evaluate("window.__pwned === undefined")
    assert page.blocked == []


def test_after_a_reload_the_sidebar_shows_the_end_of_the_chat(page, lab: JupyterProcess):
    """Issue 25 papercut: after a reload the sidebar drew a session's messages, scrolled to the end of each as it was
    added, and then they grew (Markdown rendered, code highlighted, plots loaded): the newest message was out of view."""
    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    for part in range(3):
        send(panel, f"**Part {part}**: a plot and forty lines.\n\n```python\nimport matplotlib.pyplot as plt\n"
                    "plt.figure(figsize=(3, 2.5))\nplt.plot([1, 3, 2])\nplt.show()\n"
                    "print('\\n'.join(f'line {n}' for n in range(40)))\n```")
        wait_idle(page)
    page.reload()
    panel = open_sidebar(page, lab)
    session = panel.locator(f'.jp-wb-session[data-session-id="{sid}"]')
    if "jp-mod-selected" not in (session.get_attribute("class") or ""):
        session.click()
    panel.locator(".jp-wb-tool .jp-wb-output img").nth(2).wait_for(timeout=60_000)
    page.wait_for_function("(() => { const n = document.querySelector('#jp-workbench .jp-wb-log');"
                           " return n && n.scrollHeight > n.clientHeight + 200"
                           " && n.scrollTop + n.clientHeight >= n.scrollHeight - 8; })()", timeout=30_000)
    # and a reader who scrolls up to read stays where they are while the chat is redrawn around them
    log = panel.locator(".jp-wb-log")
    log.hover()
    page.mouse.wheel(0, -600)
    page.wait_for_function("(() => { const n = document.querySelector('#jp-workbench .jp-wb-log');"
                           " return n.scrollTop + n.clientHeight < n.scrollHeight - 300; })()", timeout=30_000)
    page.set_viewport_size({"width": 1360, "height": 820})
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # follow() ran
    assert log.evaluate("n => n.scrollTop + n.clientHeight < n.scrollHeight - 300"), "the reader's place was lost"
