"""Data between a notebook and the agent, and the memory review in the main area, in a real JupyterLab
driven by headless Chromium: `%%agent --with` copies a DataFrame the agent's code reads, `wb.load`
brings back a file it wrote, the sidebar's Files tab lists and downloads the workspace and attaches
a file browser item; the review panel opens in the main area (no console, no code), follows the
light and dark themes and updates when a memory is accepted in the sidebar or anywhere else.
Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from hostile import TITLE, assert_control_runs, ran
from test_browser import dream_a_proposal, widen_sidebar
from wbui import CHROMIUM, JupyterProcess, lab_api, shot
from wbui import open_sidebar as open_lab_sidebar

from workbench.render import result_blocks

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")


def notebook(cells: list[str]) -> str:
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": c}
                  for i, c in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    })


AGENT_CELL = """%%agent --with sales
Total the sales by region and save the table for me:
```python
import pandas as pd
sales = pd.read_parquet('sales.parquet')
by_region = sales.groupby('region', as_index=False).amount.sum()
print(by_region.to_string(index=False))
by_region.to_csv('by_region.csv', index=False)
```"""


def open_sidebar(page, lab: JupyterProcess):
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=60_000)
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=60_000)
    panel = page.locator("#jp-workbench")
    if not panel.locator(".jp-wb-tabs").is_visible():
        tab.click()
    panel.locator(".jp-wb-tabs").wait_for()
    return panel


def test_attach_a_dataframe_and_fetch_what_the_agent_wrote(page, lab: JupyterProcess, tmp_path: Path):
    (lab.root / "data.ipynb").write_text(notebook([
        "%load_ext workbench\nimport pandas as pd\n"
        "sales = pd.DataFrame({'region': ['north', 'south', 'north', 'east'], 'amount': [120.0, 80.5, 30.0, 55.25]})",
        AGENT_CELL,
        "import workbench\nwb = workbench.connect()\nwb.load('by_region.csv')  # what the agent wrote, as a DataFrame",
    ]))
    (lab.root / "notes.txt").write_text("Quarter 3 had a holiday in the north.\n")
    page.goto(f"{lab.url}/lab/tree/data.ipynb?token={lab.token}")
    page.locator(".jp-NotebookPanel").wait_for(timeout=60_000)
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.ready; }")
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    # the last cell shows the agent's file, loaded back into this kernel, as a table
    table = cells.nth(2).locator(".jp-OutputArea table")
    table.wait_for(timeout=180_000)
    rows = table.locator("tbody tr").all_inner_texts()
    assert [r.split() for r in rows] == [["0", "east", "55.25"], ["1", "north", "150.00"], ["2", "south", "80.50"]], rows
    agent_out = cells.nth(1).locator(".jp-OutputArea")
    agent_out.get_by_text("agent: attached sales as sales.parquet").wait_for()
    agent_out.get_by_text("Here is what it printed").first.wait_for(timeout=60_000)
    cells.nth(1).scroll_into_view_if_needed()
    shot(page, "data-notebook-attach")
    cells.nth(2).scroll_into_view_if_needed()
    shot(page, "data-notebook-load")

    # the log has the copy, and the agent's code read it: its output has the totals
    # (a dream's session has no title)
    sid = next(s["id"] for s in lab_api(lab, "GET", "sessions")["sessions"] if (s["title"] or "").startswith("Total the sales"))
    events = lab_api(lab, "GET", f"sessions/{sid}/events")["events"]
    attached = [e["payload"] for e in events if e["type"] == "file_attached"]
    assert len(attached) == 1 and attached[0]["name"] == "sales" and attached[0]["kind"] == "dataframe"
    assert attached[0]["path"] == "sales.parquet" and len(attached[0]["sha256"]) == 64
    result = next(e["payload"] for e in events if e["type"] == "tool_result")
    assert "north  150.00" in result_blocks(result)[0]["text"] and not result["is_error"]

    # the sidebar's Files tab: the selected session's workspace, with a download
    panel = open_sidebar(page, lab)
    widen_sidebar(page, 170)
    panel.locator(f'li[data-session-id="{sid}"]').click()
    panel.get_by_role("tab", name="Files").click()
    files = panel.locator(".jp-wb-files")
    files.locator('li[data-path="by_region.csv"]').wait_for(timeout=30_000)
    files.locator('li[data-path="sales.parquet"]').wait_for()
    with page.expect_download() as got:
        files.locator('li[data-path="by_region.csv"]').get_by_role("button", name="Download by_region.csv").click()
    saved = tmp_path / "by_region.csv"
    got.value.save_as(saved)
    assert saved.read_text().splitlines() == ["region,amount", "east,55.25", "north,150.0", "south,80.5"]

    # attach a file from JupyterLab's file browser to the selected session
    page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
    item = page.locator('.jp-DirListing-item[data-isdir="false"]').filter(has_text="notes.txt")
    item.click()
    page.evaluate("() => window.jupyterapp.commands.execute('workbench:attach-file')")
    open_sidebar(page, lab)
    panel.get_by_role("tab", name="Files").click()
    files.locator('li[data-path="notes.txt"]').wait_for(timeout=30_000)
    assert lab_api(lab, "GET", f"sessions/{sid}/files")["files"]
    events = lab_api(lab, "GET", f"sessions/{sid}/events")["events"]
    assert [e["payload"]["path"] for e in events if e["type"] == "file_attached"] == ["sales.parquet", "notes.txt"]
    assert [e["payload"]["kind"] for e in events if e["type"] == "file_attached"] == ["dataframe", "file"]
    panel.get_by_role("tab", name="Chat").click()
    assert "[attached to your workspace: notes.txt (file, 38 bytes)]" in panel.locator(".jp-wb-input").input_value()
    # attach a notebook cell's source
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()
    page.evaluate("() => window.jupyterapp.commands.execute('workbench:attach-cell')")
    open_sidebar(page, lab)
    panel.get_by_role("tab", name="Files").click()
    files.locator('li[data-path="data-cell-1.py"]').wait_for(timeout=30_000)
    r = httpx.get(f"{lab.url}/workbench/api/sessions/{sid}/files/content", params={"path": "data-cell-1.py"},
                  headers=lab.headers, timeout=30)
    assert r.status_code == 200 and r.text.startswith("%load_ext workbench\nimport pandas as pd")
    # ... or only the text selected in it
    line = page.locator(".jp-NotebookPanel .jp-Cell").first.locator(".cm-line").nth(1)
    line.click()
    page.keyboard.press("Home")
    page.keyboard.press("Shift+End")
    page.evaluate("() => window.jupyterapp.commands.execute('workbench:attach-cell')")
    files.locator('li[data-path="data-selection-1.py"]').wait_for(timeout=30_000)
    r = httpx.get(f"{lab.url}/workbench/api/sessions/{sid}/files/content", params={"path": "data-selection-1.py"},
                  headers=lab.headers, timeout=30)
    assert r.text == "import pandas as pd", r.text
    kinds = [e["payload"]["kind"] for e in lab_api(lab, "GET", f"sessions/{sid}/events")["events"] if e["type"] == "file_attached"]
    assert kinds == ["dataframe", "file", "cell", "selection"], kinds
    shot(page, "data-sidebar-files")
    assert page.blocked == [], page.blocked


def background_of(page, selector: str) -> tuple[int, ...]:
    rgb = page.evaluate(f"getComputedStyle(document.querySelector({selector!r})).backgroundColor")
    return tuple(int(x) for x in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])


WRITE_FILES = """```python
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
plt.figure(figsize=(2, 1.5)); plt.plot([1, 3, 2]); plt.savefig('plot.png')
open('evil.svg', 'w').write('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20" onload="top.wbXss=1">'
                            '<script>top.wbXss=2</script><rect width="40" height="20" fill="teal"/></svg>')
open('notes.txt', 'w').write('<img src=x onerror="top.wbXss=3"> totals by region\\n' * 3)
open('data.bin', 'wb').write(bytes(range(256)) * 4)
open('fake.png', 'w').write('<script>top.wbXss=4</script> not an image')
print('written')
```"""


def test_the_files_tab_names_its_session_and_previews_what_the_agent_wrote(page, lab: JupyterProcess):
    """Issue 25 papercut: the Files tab only downloaded and did not say whose workspace it showed. An image is shown
    as an image by its bytes (not its name), text as text, anything else says to download it; nothing runs."""
    sid = lab_api(lab, "POST", "sessions", {"title": TITLE})["id"]
    r = httpx.post(f"{lab.url}/workbench/api/sessions/{sid}/messages", json={"text": WRITE_FILES}, headers=lab.headers,
                   timeout=30)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 120
    while not any(e["type"] == "turn_ended" for e in lab_api(lab, "GET", f"sessions/{sid}/events")["events"]):
        assert time.monotonic() < deadline, "the turn that writes the files did not end"
        time.sleep(0.2)
    panel = open_lab_sidebar(page, lab)
    widen_sidebar(page, 170)
    panel.locator(f'li[data-session-id="{sid}"]').click()
    panel.get_by_role("tab", name="Files").click()
    files = panel.locator(".jp-wb-files")
    files.locator(".jp-wb-files-title").filter(has_text=f"Files of {TITLE}").wait_for(timeout=30_000)
    assert files.get_attribute("aria-label") == f"Files of {TITLE}"
    files.locator('li[data-path="plot.png"]').wait_for(timeout=30_000)
    preview = files.locator(".jp-wb-file-preview")

    def show(path: str) -> None:
        files.locator(f'li[data-path="{path}"]').get_by_role("button", name=f"Preview {path}").click()
        files.locator(f'.jp-wb-file-preview[aria-label="Preview of {path}"]').wait_for()

    show("plot.png")
    img = preview.locator('img[alt="The image plot.png"]')
    img.wait_for(timeout=30_000)
    assert img.evaluate("el => el.complete && el.naturalWidth") > 0
    shot(page, "files-preview-image")
    show("evil.svg")  # an SVG is an image: its scripts do not run in an <img>
    preview.locator('img[alt="The image evil.svg"]').wait_for(timeout=30_000)
    show("notes.txt")
    preview.locator("pre").filter(has_text='<img src=x onerror="top.wbXss=3"> totals by region').wait_for()
    show("fake.png")  # named like an image, holds markup: shown as the text it is
    preview.locator("pre").filter(has_text="<script>top.wbXss=4</script> not an image").wait_for()
    assert preview.locator("img").count() == 0
    show("data.bin")
    preview.filter(has_text="A binary file of 1.0 KB: no preview; download it to open it.").wait_for()
    preview.get_by_role("button", name="Close the preview of data.bin").click()
    assert preview.is_hidden()
    assert ran(page) is None
    assert_control_runs(page)
    assert page.blocked == []


def test_review_panel_in_the_main_area_light_and_dark_updates_live(page, lab: JupyterProcess):
    first = dream_a_proposal(lab, "Always report temperatures in Celsius.")
    second = dream_a_proposal(lab, "Always plot with a white background.")
    page.goto(f"{lab.url}/lab?reset&token={lab.token}")
    panel = open_sidebar(page, lab)
    panel.get_by_role("tab", name="Memories").click()
    panel.locator(f'.jp-wb-memory[data-memory-id="{first}"]').wait_for(timeout=30_000)
    panel.get_by_role("button", name="Open the full review panel").click()

    # a main-area panel of its own: no console, no code
    review = page.locator("#jp-main-dock-panel #jp-workbench-review")
    review.wait_for(timeout=30_000)
    assert page.locator(".jp-CodeConsole").count() == 0 and review.locator("pre, code.language-python").count() == 0
    assert page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(has_text="Memory review").count() == 1
    review.locator("select.jp-wb-review-status").select_option("all")
    card = review.locator(f'.jp-wb-review-card[data-memory-id="{first}"]')
    card.filter(has_text="Always report temperatures in Celsius").wait_for()
    assert card.get_attribute("data-status") == "proposed"
    card.locator("summary").click()  # its provenance, one click away
    card.locator(".jp-wb-review-provenance blockquote").first.wait_for()
    light = background_of(page, "#jp-workbench-review")
    assert sum(light) > 600, light
    shot(page, "review-panel-light")

    # accepted in the sidebar: the main panel shows it at once, without a reload
    panel.locator(f'.jp-wb-memory[data-memory-id="{first}"]').get_by_role("button", name="Accept").click()
    review.locator(f'.jp-wb-review-card[data-memory-id="{first}"][data-status="accepted"]').wait_for(timeout=10_000)
    # accepted elsewhere (the REST API, as a notebook or the CLI would): the panel's poll sees it
    lab_api(lab, "PATCH", f"memories/{second}", {"action": "accept"})
    review.locator(f'.jp-wb-review-card[data-memory-id="{second}"][data-status="accepted"]').wait_for(timeout=30_000)
    # two redraws later, the provenance the reader opened is still open
    assert review.locator(f'.jp-wb-review-card[data-memory-id="{first}"] details.jp-wb-review-provenance[open]').count() == 1

    # its own actions: retire the first from the panel; the sidebar and the log agree
    review.locator(f'.jp-wb-review-card[data-memory-id="{first}"]').get_by_role("button", name="Retire").click()
    review.locator(f'.jp-wb-review-card[data-memory-id="{first}"][data-status="retired"]').wait_for(timeout=10_000)
    assert lab_api(lab, "GET", f"memories/{first}")["status"] == "retired"

    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    page.locator("#jupyterlab-splash").wait_for(state="detached")
    page.wait_for_function("() => { const c = getComputedStyle(document.querySelector('#jp-workbench-review')).backgroundColor;"
                           " const m = c.match(/\\d+/g); return m && (+m[0] + +m[1] + +m[2]) < 200; }", timeout=30_000)
    dark = background_of(page, "#jp-workbench-review")
    assert sum(dark) < 200, dark
    shot(page, "review-panel-dark")
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached")
    assert page.blocked == [], page.blocked


def test_the_review_panel_filters_by_store_and_names_each_ones_store(page, lab: JupyterProcess):
    """Memories of two stores: the panel offers a store filter (hidden while there is one store), names the
    store on each card, and the filter shows only that store's memories."""
    mine = dream_a_proposal(lab, "Always label both axes of a plot.")
    export = {"format": "workbench-memory-store", "format_version": 1, "store": "team",
              "exported_at": "2026-11-30T10:00:00+00:00", "exported_by": "person:ann", "links": [], "memories": [{
                  "id": "m00000000aa", "created_at": "2026-11-01T10:00:00+00:00", "created_by": "person:ann",
                  "proposal": "create", "targets": [], "dream_id": None, "redactions": [],
                  "versions": [{"version": 1, "ts": "2026-11-01T10:00:00+00:00", "actor": "person:ann", "action": "propose",
                                "title": "Team rule: <b>polars</b>", "text": "Prefer polars for dataframes.", "tags": [],
                                "status": "proposed", "provenance": [], "note": None}]}]}
    page.goto(f"{lab.url}/lab?reset&token={lab.token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('workbench:open-review')",
                           timeout=60_000)
    page.evaluate("window.jupyterapp.commands.execute('workbench:open-review')")
    review = page.locator("#jp-main-dock-panel #jp-workbench-review")
    review.locator(f'.jp-wb-review-card[data-memory-id="{mine}"]').wait_for(timeout=30_000)
    stores = review.locator("select.jp-wb-review-store")
    if lab_api(lab, "GET", "memories?store=team")["memories"] == []:  # the only store yet: no filter to offer
        assert stores.is_hidden()
    r = httpx.post(f"{lab.url}/workbench/api/memories/import", content=json.dumps(export).encode(),
                   headers=lab.headers, timeout=30)
    assert r.status_code == 200, r.text
    team = review.locator('.jp-wb-review-card[data-memory-id="m00000000aa"]')
    team.wait_for(timeout=30_000)  # the panel's poll brings it
    stores.wait_for(state="visible")
    assert team.locator(".jp-wb-chip-store").inner_text() == "team"
    assert team.locator("h3").inner_text() == "Team rule: <b>polars</b>"  # a title is text
    stores.select_option("team")
    review.locator(f'.jp-wb-review-card[data-memory-id="{mine}"]').wait_for(state="detached")
    assert review.locator(".jp-wb-review-card").count() == 1 and team.get_attribute("data-store") == "team"
    stores.select_option("")
    review.locator(f'.jp-wb-review-card[data-memory-id="{mine}"]').wait_for()
    assert page.blocked == [], page.blocked


# A memory's text is Markdown, with script planted in it: rendered, never run
MARKDOWN = ("Prefer **polars** for frames over a million rows:\n\n- it is lazy\n- it uses every core\n\n"
            "```python\nimport polars as pl\n```\n\n<script>top.wbXss='memory'</script>"
            "<img src=x onerror=\"top.wbXss='memory-img'\">")
WRITTEN = "2026-11-01T10:00:00.123456+00:00"  # microseconds, as the store writes them
READABLE = re.compile(r"\d{1,2} [A-Z][a-z]{2,3} \d{4} \d{2}:\d{2}")


def import_memory(lab: JupyterProcess, session_id: str, seq: int) -> str:
    """A proposed memory (Markdown text, a long title, a cited event of session_id), as an import; returns its id."""
    mid = f"m{uuid.uuid4().hex[:10]}"
    version = {"version": 1, "ts": WRITTEN, "actor": "person:ann", "action": "propose", "status": "proposed",
               "title": "Prefer polars for large frames: " + "lazily, in parallel, out of core; " * 4, "text": MARKDOWN,
               "tags": [], "provenance": [{"session_id": session_id, "seq": seq, "quote": "frames over a million rows"}],
               "note": None}
    export = {"format": "workbench-memory-store", "format_version": 1, "store": lab.store, "exported_at": WRITTEN,
              "exported_by": "person:ann", "links": [], "memories": [{
                  "id": mid, "created_at": WRITTEN, "created_by": "person:ann", "proposal": "create", "targets": [],
                  "dream_id": None, "redactions": [], "versions": [version]}]}
    r = httpx.post(f"{lab.url}/workbench/api/memories/import", content=json.dumps(export).encode(),
                   headers=lab.headers, timeout=30)
    assert r.status_code == 200, r.text
    return mid


def one_line(page, selector: str) -> bool:
    """Whether the text of the element at `selector` lies on one line (its text boxes share one top)."""
    return page.evaluate("""s => { const r = document.createRange(); r.selectNodeContents(document.querySelector(s));
        return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size === 1; }""", selector)


def test_the_review_panel_reads_as_a_person_reads(page, lab: JupyterProcess):
    """A memory's text rendered as Markdown (its script inert), its source a link that opens the session at the
    cited event, the reviewer by name, history times as people write them, the status badge on one line."""
    lab_api(lab, "POST", "sessions", {"id": "cited", "model": "scripted", "title": TITLE})
    lab_api(lab, "POST", "sessions/cited/messages", {"text": "Use polars for frames over a million rows, please."})
    for _ in range(600):
        events = lab_api(lab, "GET", "sessions/cited/events")["events"]
        if any(e["type"] == "turn_ended" for e in events):
            break
        time.sleep(0.1)
    seq = next(e["seq"] for e in events if e["type"] == "user_message")
    mid = import_memory(lab, "cited", seq)

    page.goto(f"{lab.url}/lab?reset&token={lab.token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('workbench:open-review')",
                           timeout=60_000)
    page.evaluate("window.jupyterapp.commands.execute('workbench:open-review')")
    review = page.locator("#jp-main-dock-panel #jp-workbench-review")
    card = review.locator(f'.jp-wb-review-card[data-memory-id="{mid}"]')
    card.wait_for(timeout=30_000)
    review.locator("select.jp-wb-review-status").select_option("all")

    # Markdown, rendered: emphasis, a list, a code block; no markup characters left, no planted script run
    text = card.locator(".jp-wb-review-text")
    text.locator("strong").filter(has_text="polars").wait_for(timeout=30_000)
    assert text.locator("li").count() == 2 and "import polars as pl" in text.locator("pre").first.inner_text()
    assert "**" not in text.inner_text() and "```" not in text.inner_text()
    # the badge beside a title of several lines is still one word on one line
    assert one_line(page, f'.jp-wb-review-card[data-memory-id="{mid}"] .jp-wb-chip'), card.locator(".jp-wb-chip").inner_text()

    # accepted here: the reviewer is this page's user, by the name JupyterLab gives them
    me = page.evaluate("() => window.jupyterapp.serviceManager.user.identity")
    card.get_by_role("button", name="Accept", exact=False).first.click()
    accepted = review.locator(f'.jp-wb-review-card[data-memory-id="{mid}"][data-status="accepted"]')
    accepted.wait_for(timeout=30_000)
    assert lab_api(lab, "GET", f"memories/{mid}")["updated_by"] == f"person:{me['username']}"
    assert me["display_name"] in accepted.locator(".jp-wb-review-title .jp-wb-meta").inner_text()
    accepted.get_by_role("button", name="History").click()
    rows = accepted.locator(".jp-wb-review-history li > .jp-wb-meta")
    rows.nth(1).wait_for(timeout=30_000)
    offset = page.evaluate("ts => new Date(ts).getTimezoneOffset()", WRITTEN)  # minutes behind UTC, where the page is
    local = datetime.fromisoformat(WRITTEN) - timedelta(minutes=offset)
    assert rows.nth(0).inner_text() == f"v1 · propose · ann · {local.day} {local:%b %Y %H:%M}"
    assert re.fullmatch(rf"v2 · accept · {re.escape(me['display_name'])} · {READABLE.pattern}", rows.nth(1).inner_text())
    assert "person:" not in accepted.inner_text() and ".123456" not in accepted.inner_text()
    assert one_line(page, f'.jp-wb-review-card[data-memory-id="{mid}"] .jp-wb-chip')
    # a redraw (another filter that still shows it; a poll that found a change; an action elsewhere) keeps the history
    # the reader opened open: it was lost on the next redraw, and a CI run lost test_xss to one
    drawn = accepted.element_handle()
    review.locator("select.jp-wb-review-status").select_option("accepted")
    page.wait_for_function("card => !card.isConnected", arg=drawn, timeout=30_000)  # that card is gone, redrawn
    rows.nth(1).wait_for(timeout=30_000)
    assert accepted.get_by_role("button", name="History").get_attribute("aria-expanded") == "true"

    # the source: a link named by the session's title (as text), that opens the session at that event
    accepted.locator("details.jp-wb-review-provenance summary").click()
    link = accepted.locator("a.jp-wb-review-source")
    link.filter(has_text=TITLE).wait_for(timeout=30_000)
    shot(page, "review-panel-readable")
    link.click()
    sidebar = page.locator("#jp-workbench")
    sidebar.locator('.jp-wb-session.jp-mod-selected[data-session-id="cited"]').wait_for(timeout=30_000)
    sidebar.locator(f'.jp-wb-log > [data-seq="{seq}"].jp-wb-focused').wait_for(timeout=30_000)
    assert ran(page) is None, f"a planted script ran in the review panel: {ran(page)}"

    # the Panel review app over this server links the same source to JupyterLab, which opens the session there
    from workbench.memory.panels.review import ReviewApp
    from workbench.memory.panels.source import RestSource

    source = RestSource(lab.url, lab.token)
    try:
        app = ReviewApp(source, status="all")
        app.memories.value = mid
        href = re.search(r'class="wb-open-session" href="([^"]+)"', app.provenance.objects[0][1].object).group(1)
    finally:
        source.client.close()
    page.evaluate("() => localStorage.clear()")  # no selection to restore: only the link opens the session
    page.goto(href.replace("&amp;", "&"))
    sidebar.locator(f'.jp-wb-log > [data-seq="{seq}"].jp-wb-focused').wait_for(timeout=60_000)
    assert sidebar.locator('.jp-wb-session.jp-mod-selected[data-session-id="cited"]').count() == 1
    assert "workbench-session" not in page.url  # done once: a reload does not open it again
    assert_control_runs(page)
    lab_api(lab, "PATCH", f"memories/{mid}", {"action": "retire"})
    assert page.blocked == [], page.blocked
