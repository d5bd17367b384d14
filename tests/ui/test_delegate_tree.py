"""Delegated sessions in the sidebar: each child listed under the session that started it, indented."""

from __future__ import annotations

import json
import time

import pytest
from wbui import CHROMIUM, JupyterProcess, shot

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")


def test_children_are_shown_under_their_parent(page, lab: JupyterProcess):
    from workbench.client import WorkbenchClient

    client = WorkbenchClient(lab.url, lab.token)
    try:
        tasks = [{"prompt": f"child <b>{i}</b>", "model": "scripted:worker", "title": f"<img src=x onerror=alert({i})>"}
                 for i in range(2)]
        parent = client.create_session(model="scripted:delegate", tools=["delegate"], title="the parent")["id"]
        other = client.create_session(model="scripted", title="someone else")["id"]
        client.send(parent, "```json\n" + json.dumps({"tasks": tasks}) + "\n```")
        deadline = time.monotonic() + 120
        while client.session(parent)["state"] != "ended" and time.monotonic() < deadline:
            time.sleep(0.2)
        kids = [s["id"] for s in client.children(parent)]
        assert len(kids) == 2
    finally:
        client.close()

    page.goto(f"{lab.url}/lab?token={lab.token}")
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=30_000)
    tab.click()
    panel = page.locator("#jp-workbench")
    panel.locator(f'li[data-session-id="{kids[1]}"]').wait_for(timeout=30_000)
    rows = panel.locator("li.jp-wb-session")
    order = [rows.nth(i).get_attribute("data-session-id") for i in range(rows.count())]
    at = order.index(parent)
    assert order[at + 1: at + 3] == kids  # right under their parent, oldest first
    assert order.index(other) < at  # the newer top-level session comes first, as before
    for k in kids:
        li = panel.locator(f'li[data-session-id="{k}"]')
        assert li.get_attribute("data-parent-id") == parent and li.get_attribute("data-depth") == "1"
        assert "jp-wb-child" in li.get_attribute("class")
        assert li.locator(".jp-wb-session-title").inner_text().startswith("↳ <img")  # a title is text, never markup
    assert panel.locator(f'li[data-session-id="{parent}"] .jp-wb-meta').inner_text().endswith("2 delegated")
    assert panel.locator("img").count() == 0
    shot(page, "delegate-tree")
