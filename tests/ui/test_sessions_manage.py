"""Managing sessions in the sidebar of a real JupyterLab (headless Chromium): the model picker, automatic
titles, rename, archive and the archived filter, search, edit-and-resend (a fork), delete with confirmation,
tokens shown, and the selection surviving a reload. One lab for the file."""

from __future__ import annotations

import time

import pytest

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from hostile import TITLE, assert_control_runs, ran
from wbui import CHROMIUM, JupyterProcess, lab_api, new_session, open_sidebar, session_ids, shot

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")


def wait_ended(lab: JupyterProcess, sid: str, turns: int = 1) -> None:
    for _ in range(600):
        events = lab_api(lab, "GET", f"sessions/{sid}/events")["events"]
        if sum(e["type"] == "turn_ended" for e in events) >= turns:
            return
        time.sleep(0.1)
    raise AssertionError(f"session {sid} did not end its turn")


def row(panel, sid: str):
    return panel.locator(f'.jp-wb-session[data-session-id="{sid}"]')


def act(panel, sid: str, name: str):
    """Select the session, then press one of its actions (beside its title: not inside the list's option)."""
    row(panel, sid).click()
    panel.locator(f'.jp-wb-session.jp-mod-selected[data-session-id="{sid}"]').wait_for(timeout=30_000)
    panel.locator(".jp-wb-session-actions").get_by_role("button", name=name, exact=False).click()


def test_manage_sessions_in_the_sidebar(page, lab: JupyterProcess):
    lab_api(lab, "POST", "sessions", {"id": "older", "model": "scripted"})
    lab_api(lab, "POST", "sessions/older/messages", {"text": "Tell me about **parquet** files"})
    wait_ended(lab, "older")

    page.goto(f"{lab.url}/lab?token={lab.token}")
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=60_000)
    tab.click()
    panel = page.locator("#jp-workbench")
    row(panel, "older").wait_for(timeout=30_000)
    assert "Tell me about parquet files" in row(panel, "older").inner_text()  # an automatic title, no stars

    # the model picker is fed by the server's models, the default first
    picker = panel.get_by_label("Model for new sessions")
    page.wait_for_function("document.querySelectorAll('#jp-workbench .jp-wb-model option').length > 0")
    assert picker.input_value() == "scripted" and "(default)" in picker.locator("option").first.inner_text()
    # the scripted model neither thinks nor takes an effort: those pickers are not offered for it
    assert not panel.locator(".jp-wb-effort").is_visible() and not panel.locator(".jp-wb-thinking").is_visible()

    # a new session with the picked model; its first message names it. The message is typed and sent while the
    # server is still making the session (its POST held here, as a loaded server would keep it): it waits for the
    # new session and goes there, not to the session selected before (a loaded run once lost it so)
    row(panel, "older").click()  # a session is selected, as when a researcher starts another
    panel.locator('.jp-wb-session.jp-mod-selected[data-session-id="older"]').wait_for(timeout=30_000)
    before = session_ids(lab)
    held: list = []
    holding = [True]

    def sessions(url: str) -> bool:  # the request carries a cache-busting query
        return url.partition("?")[0].endswith("/workbench/api/sessions")

    def hold(route) -> None:
        if holding[0] and route.request.method == "POST":
            held.append(route)
        else:
            route.fallback()

    # the route stays (it lets everything through once the POST is let go): unrouting it while the sidebar's polls
    # are in flight makes Playwright's driver send those on by itself, and the loopback guard's own continue then
    # fails ("Route is already handled!"), an error the sync API raises from the next call of any handler, which
    # leaves that request unsent (a CI run lost the new session's message so)
    page.route(sessions, hold)
    panel.get_by_role("button", name="+ New session").click()
    for _ in range(600):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the sidebar asked for no new session"
    composer = panel.locator("textarea.jp-wb-input")
    composer.fill("```python\nprint(6 * 7)\n```\nWhat does this print?")
    composer.press("Enter")
    page.wait_for_timeout(300)  # time for a message to go wrong, before the session exists
    holding[0] = False
    held[0].continue_()  # to the lab (loopback)
    page.wait_for_function("""[...document.querySelectorAll('#jp-workbench .jp-wb-session-title')]
        .some(e => e.textContent.includes('What does this print?'))""", timeout=60_000)
    new = panel.locator(".jp-wb-session.jp-mod-selected")
    sid = new.get_attribute("data-session-id")
    assert lab_api(lab, "GET", f"sessions/{sid}")["model"] == "scripted"
    wait_ended(lab, sid)
    older = lab_api(lab, "GET", "sessions/older/events")["events"]
    assert sum(e["type"] == "user_message" for e in older) == 1, "the new session's message went to the one before"
    assert session_ids(lab) - before == {sid}, "one press of + New session made more than one session"
    page.wait_for_function("document.querySelector('#jp-workbench .jp-wb-usage').textContent.includes(' in ·')",
                           timeout=30_000)

    # rename through the dialog
    act(panel, sid, "Rename")
    dialog = page.locator(".jp-Dialog")
    dialog.locator("input").fill("Six times seven ✓")
    dialog.locator(".jp-mod-accept").click()
    page.wait_for_function(f"""document.querySelector('#jp-workbench .jp-wb-session[data-session-id="{sid}"]')
        ?.textContent.includes('Six times seven ✓')""", timeout=30_000)
    assert lab_api(lab, "GET", f"sessions/{sid}")["title"] == "Six times seven ✓"

    # search finds words of the messages, not only titles
    search = panel.get_by_label("Search sessions (titles and messages)")
    search.fill("PARQUET")
    page.wait_for_function("document.querySelectorAll('#jp-workbench .jp-wb-session').length === 1", timeout=30_000)
    assert row(panel, "older").count() == 1 and "parquet" in row(panel, "older").inner_text().lower()
    search.fill("")
    row(panel, sid).wait_for(timeout=30_000)

    # archive hides it; the archived filter shows it; unarchive brings it back. Its button is an archive box, not
    # the arrow (⇣) that read as Download
    act(panel, "older", "Rename")  # selects it; the dialog, which opens with the title to edit, is dismissed
    title = lab_api(lab, "GET", "sessions/older")["title"]
    assert title and page.get_by_role("dialog").locator("input").input_value() == title
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    archive = panel.locator(".jp-wb-session-actions").get_by_role("button", name="Archive:", exact=False)
    assert archive.locator("svg").count() == 1 and archive.inner_text().strip() == "", archive.inner_html()
    act(panel, "older", "Archive:")
    row(panel, "older").wait_for(state="detached", timeout=30_000)
    assert lab_api(lab, "GET", "sessions/older")["archived"] is True
    panel.locator(".jp-wb-archived-filter").check()
    row(panel, "older").wait_for(timeout=30_000)
    assert row(panel, sid).count() == 0
    act(panel, "older", "Unarchive")
    row(panel, "older").wait_for(state="detached", timeout=30_000)
    panel.locator(".jp-wb-archived-filter").uncheck()
    row(panel, "older").wait_for(timeout=30_000)

    # a draft belongs to its session: not carried into a new one, there again when its session is selected again
    row(panel, "older").click()
    panel.locator('.jp-wb-session.jp-mod-selected[data-session-id="older"]').wait_for(timeout=30_000)
    assert composer.input_value() == "", "the message sent while a new session was made stayed as older's draft"
    composer.fill("half a thought about parquet")
    drafted = new_session(panel)
    assert composer.input_value() == "", "the draft of 'older' came along into the new session"
    # an untitled session is named for a screen reader by when it started, never by its hex id (issue 25 papercut)
    label = panel.locator(".jp-wb-session-actions").get_by_role("button", name="Delete", exact=False) \
        .get_attribute("aria-label")
    assert label.startswith("Delete: the untitled session of ") and drafted not in label, label
    composer.fill("a thought for the new one")
    row(panel, "older").click()
    panel.locator('.jp-wb-session.jp-mod-selected[data-session-id="older"]').wait_for(timeout=30_000)
    assert composer.input_value() == "half a thought about parquet"
    row(panel, drafted).click()
    panel.locator(f'.jp-wb-session.jp-mod-selected[data-session-id="{drafted}"]').wait_for(timeout=30_000)
    assert composer.input_value() == "a thought for the new one"
    composer.fill("")

    # edit and resend: a fork before the message, with the edited text sent there
    row(panel, sid).click()
    edit = panel.get_by_role("button", name="Edit this message and try it again in a fork")
    edit.first.wait_for(timeout=30_000)
    edit.first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator("textarea").fill("```python\nprint(6 * 8)\n```")
    dialog.locator(".jp-mod-accept").click()
    page.wait_for_function(f"""(() => {{ const s = document.querySelector('#jp-workbench .jp-wb-session.jp-mod-selected');
        return s && s.dataset.sessionId !== '{sid}'; }})()""", timeout=60_000)
    fork = panel.locator(".jp-wb-session.jp-mod-selected").get_attribute("data-session-id")
    wait_ended(lab, fork)
    events = lab_api(lab, "GET", f"sessions/{fork}/events")["events"]
    # forked just before the edited message: what came before it (its automatic title, committed with it) stays
    first = next(e["seq"] for e in lab_api(lab, "GET", f"sessions/{sid}/events")["events"] if e["type"] == "user_message")
    assert events[0]["payload"]["forked_from"] == {"session_id": sid, "seq": first - 1}
    assert [e["payload"]["text"] for e in events if e["type"] == "user_message"] == ["```python\nprint(6 * 8)\n```"]
    page.wait_for_function("document.querySelector('#jp-workbench .jp-wb-log, #jp-workbench').textContent.includes('48')",
                           timeout=60_000)

    # the selection survives a reload
    page.reload()
    tab.wait_for(timeout=60_000)
    page.wait_for_function(f"""document.querySelector('#jp-workbench .jp-wb-session.jp-mod-selected')
        ?.dataset.sessionId === '{fork}'""", timeout=60_000)
    try:  # the layout restorer reopens the sidebar it remembers; if it does not, open it
        panel.wait_for(state="visible", timeout=10_000)
    except PlaywrightTimeout:
        tab.click()
    row(panel, sid).wait_for(state="visible", timeout=30_000)

    # delete asks first; cancelling keeps it, confirming removes it everywhere
    act(panel, sid, "Delete")
    page.locator(".jp-Dialog").get_by_role("button", name="Cancel").click()
    assert lab_api(lab, "GET", f"sessions/{sid}")["id"] == sid
    act(panel, sid, "Delete")
    page.locator(".jp-Dialog .jp-mod-warn").click()
    row(panel, sid).wait_for(state="detached", timeout=30_000)
    import httpx

    r = httpx.get(f"{lab.url}/workbench/api/sessions/{sid}", headers=lab.headers, timeout=30)
    assert r.status_code == 404
    assert not page.blocked, page.blocked


# A message whose match sits mid-sentence, with script beside it (it must stay text in the snippet)
FOUND = ("Earlier we compared three storage formats for the survey data; the <script>top.wbXss='snippet'</script> "
         "zeppelin benchmark showed parquet reads four times faster than CSV on the laptop, and the team agreed.")


def test_search_shows_where_it_matched_on_a_line_of_its_own_and_opens_the_session_there(page, lab: JupyterProcess):
    """A search hit's snippet is a full-width line under its title, the matched words marked and the text escaped;
    clicking the hit opens the session with the matching event outlined and in view, not at the chat's end."""
    lab_api(lab, "POST", "sessions", {"id": "found", "model": "scripted", "title": TITLE})
    lab_api(lab, "POST", "sessions/found/messages", {"text": FOUND})
    wait_ended(lab, "found")
    lab_api(lab, "POST", "sessions/found/messages", {"text": "\n\n".join(f"Line {i} of a long later message." for i in range(60))})
    wait_ended(lab, "found", turns=2)
    seq = next(e["seq"] for e in lab_api(lab, "GET", "sessions/found/events")["events"]
               if e["type"] == "user_message" and "zeppelin" in e["payload"]["text"])

    panel = open_sidebar(page, lab)
    panel.get_by_label("Search sessions (titles and messages)").fill("ZEPPELIN")
    hit = row(panel, "found")
    snippet = hit.locator(".jp-wb-snippet")
    snippet.wait_for(timeout=30_000)
    assert [m.inner_text() for m in snippet.locator("mark").all()] == ["zeppelin"]  # any case, as the search matched
    assert "<script>top.wbXss='snippet'</script>" in snippet.inner_text() and snippet.locator("script").count() == 0
    title, box, whole = hit.locator(".jp-wb-session-title").bounding_box(), snippet.bounding_box(), hit.bounding_box()
    assert box["width"] > 0.8 * whole["width"], (box, whole)  # a line of its own, not the status dot's column
    assert box["y"] >= title["y"] + title["height"] - 1, (box, title)  # under the title
    mark = snippet.locator("mark").bounding_box()
    assert box["y"] <= mark["y"] and mark["y"] + mark["height"] <= box["y"] + box["height"], (mark, box)  # not cut off
    shot(page, "sidebar-search-snippet")

    hit.click()
    panel.locator('.jp-wb-session.jp-mod-selected[data-session-id="found"]').wait_for(timeout=30_000)
    at = panel.locator(f'.jp-wb-log > [data-seq="{seq}"].jp-wb-focused')
    at.wait_for(timeout=30_000)
    page.wait_for_function("""s => { const log = document.querySelector('#jp-workbench .jp-wb-log');
        const el = log.querySelector(`:scope > [data-seq="${s}"]`); if (!el) return false;
        const a = el.getBoundingClientRect(), b = log.getBoundingClientRect();
        return a.bottom > b.top && a.top < b.bottom; }""", arg=seq, timeout=30_000)
    at.filter(has_text="zeppelin").wait_for(timeout=30_000)  # the message, rendered (its Markdown renders after it is added)
    assert ran(page) is None, f"a planted script ran in the sidebar: {ran(page)}"
    assert_control_runs(page)
    assert not page.blocked, page.blocked
