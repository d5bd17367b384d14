"""The review panels: driven from Python (widgets clicked, store checked), and served (behind its token) to headless Chromium offline."""

from __future__ import annotations

import base64
import contextlib
import getpass
import http.client
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from workbench.errors import DatabaseLocked
from workbench.log import DuckDBLog
from wbmemory import dream


# the panels (Panel and Bokeh: about 2 s of CPU) are imported by the tests that use them, not when a worker collects
# this file
def ReviewApp(*args, **kw):
    from workbench.memory.panels.review import ReviewApp

    return ReviewApp(*args, **kw)


def MemoryReview(*args, **kw):
    from workbench.memory.panels.widgets import MemoryReview

    return MemoryReview(*args, **kw)


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
    assert app.message_kind == "danger" and "only proposed memories can be rejected" in app.message.object

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


def test_review_app_shows_contradictions_side_by_side_and_supersedes(store):
    old = store.create(title="Prefer pandas", text="Prefer pandas for data frames.", actor="api", provenance=[], status="accepted")
    new = store.create(title="Never use pandas", text="Never use pandas: use polars.", actor="dream:d1", provenance=[])
    app = ReviewApp(store, actor="person:ann")
    app.memories.value = new
    pair = app.detail.object.split("wb-conflicts", 1)[1]
    assert "Never use pandas: use polars." in pair and "Prefer pandas for data frames." in pair and "&#x27;never&#x27;" in pair
    app.supersede_button.clicks += 1  # nothing chosen: refused, shown
    assert app.message_kind == "danger" and "needs &quot;by&quot;" in app.message.object
    app.accept_button.clicks += 1
    app.status.value = "accepted"
    app.memories.value = old
    app.superseded_by.value = new
    app.note_input.value = "moved to polars"
    app.supersede_button.clicks += 1
    m = store.get(old)
    assert m["status"] == "superseded" and m["history"][-1]["actor"] == "person:ann" and m["history"][-1]["note"] == "moved to polars"
    app.status.value = "all"
    app.memories.value = old
    assert "wb-chain" in app.detail.object and f"replaced by <code>{new}</code>" in app.detail.object
    assert "wb-conflicts" not in app.detail.object


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


def test_refused_actions_show_their_error_as_text(store, dreamed):
    """An error message carries what a person typed (here the reviewer's name): it is shown as text."""
    hostile = """<img src=x onerror="top.wbXss='actor'">"""
    app = ReviewApp(store)
    app.reviewer = hostile
    app.accept_button.clicks += 1
    assert "<img" not in app.message.object and "&lt;img src=x onerror=&quot;" in app.message.object
    assert app.message_kind == "danger"
    view = MemoryReview(store, actor=hostile)
    view.buttons["accept"].click()
    assert "&lt;img src=x onerror=&quot;" in view.message.value and "<img" not in view.message.value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def review_server(db_path: Path, port: int):
    """`workbench review` on `port` as a subprocess; yields the URL with the token it printed."""
    cmd = [str(Path(sys.executable).parent / "workbench"), "review", "--db", str(db_path), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"workbench review printed no URL with a token in 60 s: {seen}") from None
            seen.append(line)
            found = re.search(r"http://127\.0\.0\.1:\d+/review\?token=[\w-]+", line)
            if found:
                break
        yield found.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _request(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """One HTTP request, redirects not followed: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode(errors="replace")
    finally:
        conn.close()


def _ws_upgrade(port: int, path: str, headers: dict[str, str] | None = None) -> int:
    """The status a websocket handshake to `path` gets (101: accepted)."""
    key = base64.b64encode(os.urandom(16)).decode()
    status, _, _ = _request(port, "GET", path, {
        "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Protocol": "bokeh", "Origin": f"http://127.0.0.1:{port}", **(headers or {})})
    return status


def test_served_review_refuses_clients_without_its_token(store, dreamed, db_path):
    store.log.close()
    port = _free_port()
    with review_server(db_path, port) as url:
        token = parse_qs(urlparse(url).query)["token"][0]
        assert len(token) >= 32
        cookie = f"workbench-review-{port}"

        # without the token: a plain 403 for every path, the websocket included
        for path in ["/review", "/", "/review/autoload.js", "/review/metadata", "/static/js/bokeh.min.js", "/favicon.ico", "/nope"]:
            status, headers, body = _request(port, "GET", path)
            assert (status, headers["content-type"]) == (403, "text/plain; charset=utf-8"), path
            assert "token" in body and "<" not in body
        assert _request(port, "POST", "/review")[0] == 403
        assert _ws_upgrade(port, "/review/ws") == 403

        # a wrong, oversized, non-ASCII or malformed credential is no credential
        for query in ["token=wrong", f"token={token[:-1]}", f"token={token}x", "token=" + "A" * 20_000, "token=%C3%A9%00",
                      f"TOKEN={token}", f"token[]={token}"]:
            assert _request(port, "GET", f"/review?{query}")[0] in (400, 403, 414, 431), query
        for header in [f"{cookie}=wrong", f"{cookie}={token[:-1]}", f"workbench-review-{port + 1}={token}",
                       f'{cookie}="{token}', f"{cookie}", "=;;;=\x7f", f"{cookie}=" + "A" * 20_000]:
            assert _request(port, "GET", "/review", {"Cookie": header})[0] in (400, 403, 431), header
            assert _ws_upgrade(port, "/review/ws", {"Cookie": header}) in (400, 403, 431), header
        assert _request(port, "GET", "/review", {"Authorization": f"token {token}"})[0] == 403  # only the query or the cookie

        # the token in the URL: an HttpOnly, same-site cookie, and the same page without the token
        status, headers, _ = _request(port, "GET", f"/review?token={token}&x=1")
        assert status == 302 and headers["location"] == "/review?x=1"
        set_cookie = headers["set-cookie"]
        assert set_cookie.startswith(f"{cookie}={token};") and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        # a path that reads as another host stays on this one
        for path in ("//elsewhere.example/x", "/\\elsewhere.example/x", "/\\/elsewhere.example/x"):
            status, headers, _ = _request(port, "GET", f"{path}?token={token}")
            assert status == 302 and headers["location"] == "/elsewhere.example/x", path

        status, _, page = _request(port, "GET", "/review", {"Cookie": f"{cookie}={token}"})
        assert status == 200 and "workbench memory review" in page and token not in page
        assert _ws_upgrade(port, "/review/ws", {"Cookie": f"{cookie}={token}"}) == 101


def test_review_served_to_headless_chromium_offline(store, dreamed, db_path):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "the system chromium is needed (apt-get install chromium; scripts/test.sh does it)"
    target = store.get(dreamed["proposed"][0])
    store.log.close()
    port = _free_port()
    blocked: list[str] = []
    with review_server(db_path, port) as url:
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
                page.goto(url)
                assert "token" not in page.url  # it went into a cookie
                page.get_by_text(target["text"][:30]).first.wait_for(timeout=30000)
                page.get_by_role("button", name="Accept", exact=True).click()
                page.get_by_text(f"{target['id']} is now accepted").wait_for(timeout=30000)
                # a reload works with the cookie alone
                page.reload()
                page.get_by_text("Dream timeline").wait_for(timeout=30000)
            finally:
                browser.close()
    assert blocked == [], f"the page tried to reach the network: {blocked}"
    with DuckDBLog(db_path) as log:
        from workbench.memory import MemoryStore

        m = MemoryStore(log).get(target["id"])
    assert m["status"] == "accepted" and m["history"][-1]["actor"] == f"person:{getpass.getuser()}"


# A memory's text is Markdown, with script planted in it: rendered, its markup shown as text
MARKDOWN = ("Prefer **polars** for frames over a million rows:\n\n- it is lazy\n- it uses every core\n\n"
            "```python\nimport polars as pl\n```\n\n<script>top.wbXss='memory'</script>")
READABLE = r"\d{1,2} [A-Z][a-z]{2,3} \d{4} \d{2}:\d{2}"


def test_review_app_renders_markdown_and_names_people_and_times_plainly(store, recorded):
    """The detail: the text as Markdown (raw HTML escaped), people by name, history times without seconds, the badge
    on one line; a cited event is also a link that opens the session there, when the panel knows a server."""
    sid = recorded[0]
    mid = store.create(title="Prefer polars", text=MARKDOWN, actor="person:ann", provenance=[{"session_id": sid, "seq": 2}])
    app = ReviewApp(store, actor="person:bob", session_url=lambda s, n: f"http://lab.test/lab?workbench-session={s}&x=<{n}>")
    app.memories.value = mid
    html = app.detail.object
    assert "<strong>polars</strong>" in html and html.split("wb-history")[0].count("<li>") == 2 and "import polars as pl" in html
    assert "**" not in html and "<script" not in html and "&lt;script&gt;top.wbXss" in html
    assert "person:" not in html and "proposed by ann" in html and "white-space:nowrap" in html
    stored = store.get(mid)["history"][0]["ts"]
    history = re.search(r'class="wb-history".*', html, re.S).group(0)
    assert re.search(rf"v1 · propose · ann · {READABLE}</li>", history) and stored not in history and stored[:16] not in history
    assert app.actor.value == "bob"
    links = app.provenance.objects[0][1].object
    assert f'href="http://lab.test/lab?workbench-session={sid}&amp;x=&lt;2&gt;"' in links


def test_served_review_reads_as_a_person_reads(store, db_path):
    """Served to headless Chromium: a memory's Markdown rendered (the script planted in it shows as text and does
    not run), the status badge on one line beside a long title, people by name, history times as people write them."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "the system chromium is needed (apt-get install chromium; scripts/test.sh does it)"
    mid = store.create(title="Prefer polars for large frames: " + "lazily, in parallel, out of core; " * 4, text=MARKDOWN,
                       actor="person:ann", provenance=[])
    store.log.close()
    with review_server(db_path, _free_port()) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        try:
            page = browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
            page.goto(url)
            text = page.locator(".wb-markdown")
            text.locator("strong").filter(has_text="polars").wait_for(timeout=30_000)
            assert text.locator("li").count() == 2 and "import polars as pl" in text.locator("pre").inner_text()
            page.get_by_text("<script>top.wbXss='memory'</script>").wait_for()  # as text
            badge = page.locator(".wb-memory .wb-status")
            assert badge.evaluate("""el => { const r = document.createRange(); r.selectNodeContents(el);
                return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }""") == 1
            history = page.locator(".wb-history li")
            assert re.fullmatch(rf"v1 · propose · ann · {READABLE}", history.first.inner_text()), history.first.inner_text()
            page.get_by_role("button", name="Accept", exact=True).click()
            page.get_by_text(f"{mid} is now accepted").wait_for(timeout=30_000)
            assert page.evaluate("() => top.wbXss ?? null") is None
        finally:
            browser.close()
    with DuckDBLog(db_path) as log:
        from workbench.memory import MemoryStore

        history = MemoryStore(log).get(mid)["history"]
    assert history[-1]["actor"] == f"person:{getpass.getuser()}"
