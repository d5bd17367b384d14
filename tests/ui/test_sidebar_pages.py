"""The sidebar's session list in a real JupyterLab (headless Chromium): a page at a time with
"Load more", and a poll that asks only for what changed, never for the whole list."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from wbui import CHROMIUM, JupyterProcess, lab_api

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")


def test_the_session_list_pages_and_polls_only_what_changed(page, lab: JupyterProcess):
    for i in range(60):
        lab_api(lab, "POST", "sessions", {"id": f"chat{i:02d}", "title": f"chat number {i}", "model": "scripted"})
    lab_api(lab, "POST", "sessions", {"id": "zzdream", "title": "not a chat", "model": "scripted"})  # a chat too, newest
    listings: list[dict] = []
    page.on("request", lambda r: listings.append(parse_qs(urlparse(r.url).query))
            if urlparse(r.url).path.endswith("/workbench/api/sessions") and r.method == "GET" else None)

    page.goto(f"{lab.url}/lab?token={lab.token}")
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=30_000)
    tab.click()
    panel = page.locator("#jp-workbench")
    rows = panel.locator(".jp-wb-session")
    more = panel.get_by_role("button", name="Load more")
    more.wait_for(timeout=30_000)
    assert rows.count() == 50
    assert rows.first.get_attribute("data-session-id") == "zzdream"  # newest first
    more.click()
    page.wait_for_function("document.querySelectorAll('#jp-workbench .jp-wb-session').length === 61")
    assert more.count() == 0  # the last page: no more to load
    ids = [rows.nth(i).get_attribute("data-session-id") for i in range(61)]
    assert len(set(ids)) == 61 and ids[-1] == "chat00"

    # a session made elsewhere (a notebook, the CLI) shows up at the top by the next poll
    lab_api(lab, "POST", "sessions", {"id": "from-elsewhere", "title": "made elsewhere", "model": "scripted"})
    panel.locator('.jp-wb-session[data-session-id="from-elsewhere"]').wait_for(timeout=60_000)
    assert rows.first.get_attribute("data-session-id") == "from-elsewhere" and rows.count() == 62
    # every request for the list was a page or a poll of what changed, never the whole listing
    assert listings and all(q.get("limit") for q in listings), listings
    polls = [q for q in listings if "updated_after" in q]
    assert polls, listings
