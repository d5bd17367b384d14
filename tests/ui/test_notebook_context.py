"""The notebook as context (issue 25, item 6), in a real `jupyter lab` driven in headless Chromium: "Ask about
selection", "Include the active notebook" and "Fix this error" send the cells' source and outputs with the
message, shown there as a chip that opens to what was sent (script in a cell shown as text); Replace puts the
reply's code into the cell the message was about, and the notebook's undo takes it back."""

from __future__ import annotations

import json

import httpx
import pytest
from wbui import CHROMIUM, JupyterProcess, lab_api, new_session, open_sidebar, send, shot, wait_idle

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")

SCRIPT = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"
FAILED_SOURCE = "rates['eur'] / 0"


def notebook(cells: list[dict]) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                            "language": "python"}}, "cells": cells}


def code(n: int, source: str, outputs: list[dict]) -> dict:
    return {"cell_type": "code", "id": f"cell-{n}", "metadata": {}, "execution_count": n, "source": source,
            "outputs": outputs}


CELLS = [
    {"cell_type": "markdown", "id": "cell-0", "metadata": {}, "source": "# Rates"},
    code(1, f"rates = {{'eur': 1.1}}  # {SCRIPT}", [{"output_type": "stream", "name": "stdout", "text": "loaded\n"}]),
    code(2, FAILED_SOURCE, [{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                             "traceback": ["\u001b[0;31mZeroDivisionError\u001b[0m: division by zero"]}]),
    code(3, "rates", [{"output_type": "execute_result", "execution_count": 3, "metadata": {},
                       "data": {"text/plain": "{'eur': 1.1}", "image/png": "iVBORw0KGgo="}}]),
]


def put_notebook(lab: JupyterProcess, path: str, nb: dict) -> None:
    r = httpx.put(f"{lab.url}/api/contents/{path}", headers={"Authorization": f"token {lab.token}"},
                  json={"type": "notebook", "format": "json", "content": nb}, timeout=60)
    r.raise_for_status()


def open_notebook(page, path: str):
    page.evaluate("(p) => window.jupyterapp.commands.execute('docmanager:open', {path: p, factory: 'Notebook'})", path)
    nb = page.locator(".jp-NotebookPanel").filter(has=page.locator(".jp-Cell")).last
    nb.locator(".jp-Cell").nth(len(CELLS) - 1).wait_for(timeout=60_000)
    return nb


def select(page, first: int, last: int | None = None) -> None:
    """Make cell `first` active and extend the selection to `last` (the notebook's own selection)."""
    page.evaluate("""([a, b]) => {
        const nb = window.jupyterapp.shell.currentWidget.content;
        nb.mode = 'command'; nb.activeCellIndex = a; nb.deselectAll();
        if (b !== null) { nb.extendContiguousSelectionTo(b); }
    }""", [first, last])


def command(page, name: str) -> None:
    page.evaluate("(c) => window.jupyterapp.commands.execute(c)", name)


def user_events(lab: JupyterProcess, sid: str) -> list[dict]:
    return [e["payload"] for e in lab_api(lab, "GET", f"sessions/{sid}/events")["events"] if e["type"] == "user_message"]


def close_all(page) -> None:
    """Closed without saving, so the next page's restored workspace does not reopen them."""
    page.evaluate("() => { window.jupyterapp.commands.execute('application:close-all'); }")
    discard = page.locator(".jp-Dialog").get_by_role("button", name="Discard")
    try:
        discard.click(timeout=5_000)
    except Exception:  # nothing was changed: no dialog
        pass
    page.locator(".jp-NotebookPanel").first.wait_for(state="detached", timeout=30_000)


def test_ask_about_selection_sends_the_cells_and_shows_them_escaped(page, lab: JupyterProcess):
    put_notebook(lab, "ctx.ipynb", notebook(CELLS))
    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    open_notebook(page, "ctx.ipynb")
    select(page, 1, 2)
    command(page, "workbench:ask-selection")
    pending = panel.locator(".jp-wb-pending .jp-wb-attachment")
    pending.filter(has_text="cells 2-3 of ctx.ipynb").wait_for()
    send(panel, "What do these cells do?")
    chip = panel.locator(".jp-wb-user .jp-wb-attachment").filter(has_text="cells 2-3 of ctx.ipynb")
    chip.wait_for(timeout=60_000)
    pending.first.wait_for(state="detached")  # sent: the composer holds no context any more
    chip.locator("summary").click()
    shown = chip.locator(".jp-wb-attachment-cells").inner_text()
    assert SCRIPT in shown and FAILED_SOURCE in shown and "ZeroDivisionError: division by zero" in shown, shown
    assert "loaded" in shown and "\x1b" not in shown
    wait_idle(page)
    # the model read the cells: the scripted model says back what it was sent
    reply = panel.locator(".jp-wb-assistant").filter(has_text="You said")
    assert "rates = {'eur': 1.1}" in reply.inner_text()
    assert page.evaluate("window.__pwned") is None
    [message] = user_events(lab, sid)
    [att] = message["attachments"]
    assert (att["kind"], att["path"], [c["index"] for c in att["cells"]]) == ("cells", "ctx.ipynb", [1, 2])
    assert att["cells"][1]["outputs"] == [{"type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                                           "traceback": ["ZeroDivisionError: division by zero"]}]
    assert att["cells"][0]["id"] == "cell-1" and att["cells"][0]["source"].endswith(SCRIPT)
    shot(page, "context-ask-selection")
    # at most four wait in the composer (the oldest goes); the same cells again take their own chip's place
    for first, last in ((0, None), (1, None), (2, None), (3, None), (0, 1), (3, None)):
        select(page, first, last)
        command(page, "workbench:ask-selection")
    page.wait_for_function("() => document.querySelectorAll('#jp-workbench .jp-wb-pending .jp-wb-attachment')"
                           ".length === 4 && !document.querySelector('#jp-workbench .jp-wb-pending')"
                           ".textContent.includes('cell 1 of')")
    assert pending.locator(".jp-wb-attachment-label").all_inner_texts() == [
        "cell 2 of ctx.ipynb", "cell 3 of ctx.ipynb", "cells 1-2 of ctx.ipynb", "cell 4 of ctx.ipynb"]
    close_all(page)


def test_include_the_active_notebook_within_its_budget(page, lab: JupyterProcess):
    big = [code(n, f"# {n}\n" + "x = 1\n" * 15_000, []) for n in range(1, 5)]  # 90,000 characters each
    put_notebook(lab, "ctx2.ipynb", notebook(CELLS))
    put_notebook(lab, "big.ipynb", notebook(big))
    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    open_notebook(page, "ctx2.ipynb")
    command(page, "workbench:include-notebook")
    pending = panel.locator(".jp-wb-pending .jp-wb-attachment")
    pending.filter(has_text="the notebook ctx2.ipynb").wait_for()
    # taken off with its ×, then included again
    pending.get_by_role("button", name="Remove the notebook ctx2.ipynb").click()
    pending.first.wait_for(state="detached")
    command(page, "workbench:include-notebook")
    send(panel, "Summarise the notebook")
    panel.locator(".jp-wb-user .jp-wb-attachment").filter(has_text="the notebook ctx2.ipynb").wait_for(timeout=60_000)
    wait_idle(page)
    [att] = user_events(lab, sid)[0]["attachments"]
    assert att["kind"] == "notebook" and [c["cell_type"] for c in att["cells"]] == ["markdown", "code", "code", "code"]
    assert att["cells"][3]["outputs"] == [{"type": "result", "text": "{'eur': 1.1}"},
                                          {"type": "note", "text": "not sent: a image/png output"}]
    close_all(page)

    # a notebook over the budget: the cells that fit, and how many were left out, said in the chip
    open_notebook(page, "big.ipynb")
    command(page, "workbench:include-notebook")
    send(panel, "And this one?")
    chip = panel.locator(".jp-wb-user .jp-wb-attachment").filter(has_text="the notebook big.ipynb")
    chip.wait_for(timeout=60_000)
    chip.locator("summary").click()
    chip.locator(".jp-wb-note").filter(has_text="2 more cells left out").wait_for()
    wait_idle(page)
    att = user_events(lab, sid)[1]["attachments"][0]
    assert len(att["cells"]) == 2 and att["omitted"] == 2
    close_all(page)


def test_fix_this_error_sends_the_failed_cell_from_the_toolbar(page, lab: JupyterProcess):
    put_notebook(lab, "ctx3.ipynb", notebook(CELLS))
    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    nb = open_notebook(page, "ctx3.ipynb")
    button = nb.locator(".jp-wb-fix-error button, button.jp-wb-fix-error").first
    select(page, 1)
    page.wait_for_function("() => !window.jupyterapp.commands.isEnabled('workbench:fix-error')")
    assert button.is_disabled()
    select(page, 2)  # the cell whose last output is an error
    page.wait_for_function("() => window.jupyterapp.commands.isEnabled('workbench:fix-error')")
    button.wait_for()
    page.wait_for_function("(b) => !b.disabled", arg=button.element_handle())
    button.click()
    chip = panel.locator(".jp-wb-user .jp-wb-attachment").filter(has_text="cell 3 of ctx3.ipynb")
    chip.wait_for(timeout=60_000)
    wait_idle(page)
    [message] = user_events(lab, sid)
    assert message["text"].startswith("Fix this error")
    [att] = message["attachments"]
    assert [(c["index"], c["id"], c["source"]) for c in att["cells"]] == [(2, "cell-2", FAILED_SOURCE)]
    assert att["cells"][0]["outputs"][0]["traceback"] == ["ZeroDivisionError: division by zero"]
    shot(page, "context-fix-error")
    close_all(page)


def test_replace_puts_the_replys_code_into_the_cell_and_undo_takes_it_back(page, lab: JupyterProcess):
    put_notebook(lab, "ctx4.ipynb", notebook(CELLS))
    panel = open_sidebar(page, lab)
    new_session(panel)
    nb = open_notebook(page, "ctx4.ipynb")
    select(page, 2)
    command(page, "workbench:ask-selection")
    # the scripted model says back what it was sent: the reply holds this code block, under the cell it was about
    send(panel, "Divide by one instead:\n\n```text\nrates['eur'] / 1\n```")
    reply = panel.locator(".jp-wb-assistant").filter(has_text="You said")
    reply.wait_for(timeout=60_000)
    wait_idle(page)
    replace = reply.get_by_role("button", name="Replace cell 3 of ctx4.ipynb with this code")
    replace.wait_for()
    # the user's own message has no Replace, nor has a reply to a message without one cell attached
    assert panel.locator(".jp-wb-user .jp-wb-replace").count() == 0
    replace.click()
    reply.locator(".jp-wb-code-status").filter(has_text="Replaced cell 3").wait_for()
    reply.locator(".jp-wb-replace").scroll_into_view_if_needed()
    shot(page, "context-replace")
    source = "(i) => window.jupyterapp.shell.currentWidget.content.model.cells.get(i).sharedModel.getSource()"
    assert page.evaluate(source, 2) == "rates['eur'] / 1"
    assert page.evaluate(source, 1).startswith("rates = ")  # no other cell changed
    # undo, as a person does it in the notebook: Ctrl+Z in the cell
    nb.locator(".jp-Cell").nth(2).locator(".cm-content").click()
    page.keyboard.press("Control+z")
    page.wait_for_function(f"() => ({source})(2) === {json.dumps(FAILED_SOURCE)}", timeout=10_000)
    # a message about no single cell: its reply's code offers Copy and Insert, not Replace
    send(panel, "Again, with nothing attached:\n\n```text\nrates['eur'] / 2\n```")
    second = panel.locator(".jp-wb-assistant").filter(has_text="rates['eur'] / 2")
    second.locator(".jp-wb-insert").first.wait_for(timeout=60_000)
    wait_idle(page)
    assert second.locator(".jp-wb-replace").count() == 0
    close_all(page)
    assert page.blocked == []


def test_the_fixture_notebook_is_valid_nbformat():
    import nbformat

    nbformat.validate(nbformat.reads(json.dumps(notebook(CELLS)), as_version=4))
