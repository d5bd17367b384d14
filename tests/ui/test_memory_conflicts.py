"""The sidebar's Memories tab shows a proposal beside the memory it contradicts, as text, in a real
JupyterLab (headless Chromium); the pair is gone once the older one is superseded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from hostile import RAISED, assert_control_runs, ran
from wbui import CHROMIUM, JupyterProcess, lab_api

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")

OLD_TEXT = f"Prefer pandas for data frames. {RAISED}"
NEW_TEXT = """Never use pandas: the project moved to polars. <img src=x onerror="top.wbXss='conflict'">"""


def seed(db: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """An accepted memory and a proposal that contradicts it, made in a log of their own; their ids, and the
    store that holds them as its export file."""
    from workbench.host import Host
    from workbench.memory.plugin import MemoryPlugin
    from workbench.memory.store import DEFAULT_STORE
    from workbench.memory.transfer import export_store

    host = Host.build(db, hands=False, plugins=[MemoryPlugin()])
    try:
        store = host.plugin("memory").store
        old = store.create(title="Prefer pandas", text=OLD_TEXT, actor="dream:d1", provenance=[])
        store.review(old, "accept", "person:ann")
        new = store.create(title="Never use pandas", text=NEW_TEXT, actor="dream:d2", provenance=[])
        export = export_store(store, DEFAULT_STORE, "person:ann")
    finally:
        asyncio.run(host.close())
    return {"old": old, "new": new}, export


@pytest.fixture(scope="module")
def seeded_lab(lab: JupyterProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[JupyterProcess, dict[str, str]]:
    """The lab with both memories imported into the module's store, as they are (the same ids and history)."""
    ids, export = seed(tmp_path_factory.mktemp("conflicts") / "seed.duckdb")
    r = httpx.post(f"{lab.url}/workbench/api/memories/import", params={"store": lab.store},
                   content=json.dumps(export).encode(), headers=lab.headers, timeout=30)
    assert r.status_code == 200 and sorted(r.json()["imported"]) == sorted(ids.values()), r.text
    return lab, ids


def test_the_memories_tab_shows_a_contradiction_side_by_side(seeded_lab, page: Any):
    lab, ids = seeded_lab
    page.goto(f"{lab.url}/lab?reset&token={lab.token}")
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=60_000)
    tab.click()
    panel = page.locator("#jp-workbench")
    panel.get_by_role("tab", name="Memories").click()
    card = panel.locator(f'.jp-wb-memory[data-memory-id="{ids["new"]}"]')
    card.wait_for(timeout=30_000)
    pair = card.locator(f'.jp-wb-conflict[data-conflict-id="{ids["old"]}"]')
    pair.wait_for()
    sides = pair.locator(".jp-wb-conflict-side")
    assert sides.count() == 2
    # each text rendered as Markdown, untrusted, as the review panel renders it: the planted image has no handler left
    new_text = sides.nth(0).locator(".jp-wb-memory-text .jp-wb-markdown")
    new_text.filter(has_text="Never use pandas: the project moved to polars.").wait_for()
    assert new_text.locator("img[onerror]").count() == 0
    old_text = sides.nth(1).locator(".jp-wb-memory-text .jp-wb-markdown")
    old_text.filter(has_text="Prefer pandas for data frames.").wait_for()
    assert old_text.locator("img[onerror]").count() == 0
    assert "Never use pandas" in sides.nth(0).inner_text() and "Prefer pandas" in sides.nth(1).inner_text()
    assert "'never'" in pair.inner_text()
    assert ran(page) is None, f"a planted script ran in the Memories tab: {ran(page)}"

    # accepted, and the old one superseded by it: no proposal and no pair left
    lab_api(lab, "PATCH", f"memories/{ids['new']}", {"action": "accept"})
    m = lab_api(lab, "PATCH", f"memories/{ids['old']}", {"action": "supersede", "by": ids["new"]})
    assert m["status"] == "superseded" and m["current"] == ids["new"]
    page.goto(f"{lab.url}/lab?reset&token={lab.token}")
    tab.wait_for(timeout=60_000)
    tab.click()
    panel.get_by_role("tab", name="Memories").click()
    panel.get_by_text("No proposals waiting for review").wait_for(timeout=30_000)
    assert panel.locator(".jp-wb-conflict").count() == 0
    assert_control_runs(page)
    assert page.blocked == [], page.blocked
