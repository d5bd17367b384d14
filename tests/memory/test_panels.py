"""The review panels: driven from Python (widgets clicked, store checked), and served to headless Chromium offline."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from workbench.errors import DatabaseLocked
from workbench.log import DuckDBLog
from wbmemory import dream
from workbench.panels.review import ReviewApp
from workbench.panels.widgets import MemoryReview


@pytest.fixture
def dreamed(brain, store, recorded):
    """The store after one scripted dream over the recorded sessions; returns the dream's result."""
    return dream(brain, store, sessions=recorded, model="scripted:dream")


def last_version(store, mid):
    return store.get(mid)["history"][-1]


def test_review_app_driven_from_python(store, dreamed):
    app = ReviewApp(store, actor="person:ann")
    proposed = dreamed["proposed"]
    assert list(app.memories.options.values()) == proposed

    # provenance: one click shows the cited event in context, its quote marked
    app.memories.value = proposed[1]
    cite = store.get(proposed[1])["provenance"][0]
    app.provenance.objects[0][0].clicks += 1
    assert f"around #{cite['seq']}" in app.source_pane.object
    assert '<mark class="wb-quote">' in app.source_pane.object and "wb-cited" in app.source_pane.object

    # accept as is
    app.memories.value = proposed[0]
    app.accept_button.clicks += 1
    assert (store.get(proposed[0])["status"], last_version(store, proposed[0])["actor"]) == ("accepted", "person:ann")
    assert proposed[0] not in app.memories.options.values()  # the status filter is "proposed"

    # edit, then accept
    app.memories.value = proposed[1]
    app.text_input.value = "Guard divisions: use max(n, 1) as the divisor."
    app.accept_edited_button.clicks += 1
    m = store.get(proposed[1])
    assert m["status"] == "accepted" and m["text"] == "Guard divisions: use max(n, 1) as the divisor."
    assert [v["action"] for v in m["history"]] == ["propose", "edit", "accept"]

    # reject, with a note
    app.memories.value = proposed[2]
    app.note_input.value = "not a durable fact"
    app.reject_button.clicks += 1
    assert (store.get(proposed[2])["status"], last_version(store, proposed[2])["note"]) == ("rejected", "not a durable fact")

    # merge two accepted memories into one
    app.status.value = "accepted"
    assert set(app.memories.options.values()) == {proposed[0], proposed[1]}
    app.memories.value = proposed[0]
    app.merge_with.value = [proposed[1]]
    app.title_input.value = "Ratios"
    app.merge_button.clicks += 1
    assert store.get(proposed[0])["status"] == store.get(proposed[1])["status"] == "superseded"
    merged = store.list(status="accepted")
    assert len(merged) == 1 and merged[0]["targets"] == [proposed[0], proposed[1]] and merged[0]["created_by"] == "person:ann"

    # a refused action is shown, not raised
    app.status.value = "rejected"
    app.memories.value = proposed[2]
    app.reject_button.clicks += 1
    assert app.message.alert_type == "danger" and "only proposed memories can be rejected" in app.message.object

    # filters by tag and dream; the dream's own session as a timeline
    app.status.value = "all"
    app.tag.value = "preference"
    assert all("preference" in store.get(i)["tags"] for i in app.memories.options.values())
    app.tag.value = "all"
    app.dream.value = dreamed["dream_id"]
    assert set(app.memories.options.values()) == set(proposed)
    assert app.timeline_dream.value == dreamed["dream_id"]
    assert "propose_memory" in app.timeline.object and "dream_read" in app.timeline.object


def test_edit_proposals_show_a_diff(store):
    old = store.create(title="Ratios", text="Print ratios plainly.", actor="api", provenance=[], status="accepted")
    edit = store.create(title="Ratios", text="Print ratios with two decimals.", actor="dream:d1", provenance=[],
                        proposal="edit", targets=[old])
    app = ReviewApp(store)
    app.memories.value = edit
    assert "-Print ratios plainly." in app.diff.object and "+Print ratios with two decimals." in app.diff.object


def test_ipywidgets_review(store, dreamed):
    view = MemoryReview(store, actor="person:bob")
    first, second = dreamed["proposed"][:2]
    assert view.memories.value == first
    view.citations.children[0].click()
    assert "wb-cited" in view.source_view.value
    view.buttons["accept"].click()
    assert store.get(first)["status"] == "accepted" and last_version(store, first)["actor"] == "person:bob"
    assert view.memories.value == second
    view.text.value = "Edited by Bob."
    view.buttons["accept_edited"].click()
    assert store.get(second)["text"] == "Edited by Bob." and store.get(second)["status"] == "accepted"
    view.buttons["reject"].click()
    assert store.get(dreamed["proposed"][2])["status"] == "rejected"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"workbench review exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)  # polling a port that is not open yet: there is no event to await
    raise AssertionError(f"{url} did not answer in {timeout} s")


def test_review_served_to_headless_chromium_offline(store, dreamed, db_path):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "the system chromium is needed (apt-get install chromium; scripts/test.sh does it)"
    target = store.get(dreamed["proposed"][0])
    store.log.close()
    port = _free_port()
    cmd = [str(Path(sys.executable).parent / "workbench"), "review", "--db", str(db_path), "--port", str(port), "--actor", "person:browser"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    blocked: list[str] = []
    try:
        _wait_http(f"http://127.0.0.1:{port}/review", proc)
        with pytest.raises(DatabaseLocked, match="in use by another process"):
            DuckDBLog(db_path)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=[
                "--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
            try:
                context = browser.new_context()

                def route(r):
                    host = urlparse(r.request.url).hostname
                    if r.request.url.startswith(("data:", "blob:")) or host in ("127.0.0.1", "localhost"):
                        r.continue_()
                    else:
                        blocked.append(r.request.url)
                        r.abort()

                context.route("**/*", route)
                page = context.new_page()
                page.goto(f"http://127.0.0.1:{port}/review")
                page.get_by_text(target["text"][:30]).first.wait_for(timeout=30000)
                page.get_by_role("button", name="Accept", exact=True).click()
                page.get_by_text(f"{target['id']} is now accepted").wait_for(timeout=30000)
            finally:
                browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert blocked == [], f"the page tried to reach the network: {blocked}"
    with DuckDBLog(db_path) as log:
        from workbench.memory import MemoryStore

        m = MemoryStore(log).get(target["id"])
    assert m["status"] == "accepted" and m["history"][-1]["actor"] == "person:browser"
