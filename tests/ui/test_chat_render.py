"""The sidebar's chat as JupyterLab renders things, in a real `jupyter lab` driven in headless
Chromium: Markdown and tables through JupyterLab's rendermime, code blocks with Copy and Insert,
outputs as a notebook shows them, Stop/Esc/Retry, keyboard use and an axe-core check.
Screenshots go to test-artifacts/ui/ (the good ones are copied into docs/screenshots/)."""

from __future__ import annotations

import json
import re

import pytest
from wbui import (CHROMIUM, LEGACY_SESSION, LEGACY_TEXT, JupyterProcess, artifact, axe_violations, lab_api, new_session,
                  open_sidebar, send, shot, wait_idle)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")


@pytest.fixture(scope="module")
def lab(lab: JupyterProcess) -> JupyterProcess:
    """The shared JupyterLab with the session an older workbench recorded (a string result) listed again."""
    lab_api(lab, "PATCH", f"sessions/{LEGACY_SESSION}", {"archived": False})
    return lab


def widen_sidebar(page, dx: int) -> None:
    box = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + dx, y, steps=5)
    page.mouse.up()


def user_messages(lab: JupyterProcess, sid: str) -> list[str]:
    events = lab_api(lab, "GET", f"sessions/{sid}/events")["events"]
    return [e["payload"]["text"] for e in events if e["type"] == "user_message"]


MARKDOWN = "Render check\n\n**sine** waves and `inline code`\n\n| wave | period |\n|---|---|\n| sine | 6.28 |\n| square | 2 |"


def test_markdown_tables_and_outputs_render_as_in_a_notebook(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    widen_sidebar(page, 260)
    new_session(panel)
    send(panel, MARKDOWN)
    reply = panel.locator(".jp-wb-assistant").filter(has_text="You said")
    reply.wait_for(timeout=60_000)
    # The scripted model's sentence has an inline ```python``` in it: the sentence stays one paragraph
    # of text (it was cut there, the rest of the reply drawn as code).
    assert reply.locator("pre").count() == 0, reply.inner_html()[:2000]
    sentence = " ".join(reply.locator("p").filter(has_text="Send me a").inner_text().split())
    assert "Send me a python block and I will run it in my hands" in sentence, sentence
    md = reply.locator(".jp-RenderedMarkdown")
    md.locator("strong").filter(has_text="sine").wait_for()
    cells = md.locator("table td").all_inner_texts()
    assert cells == ["sine", "6.28", "square", "2"], cells
    assert "**" not in reply.inner_text(), "Markdown shows its stars"
    # The user's message is rendered as the reply is (issue 25, item 3).
    panel.locator(".jp-wb-user .jp-RenderedMarkdown strong").filter(has_text="sine").wait_for()
    assert panel.locator(".jp-wb-user table td").all_inner_texts() == ["sine", "6.28", "square", "2"]
    wait_idle(page)

    # A DataFrame returned as a value is the table pandas draws; a plot keeps its natural size.
    send(panel, "```python\nimport pandas as pd\n"
                "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(2.4, 1.6), dpi=100)\n"
                "ax.plot([0, 1, 2], [0, 1, 0])\nplt.show()\n"
                "pd.DataFrame({'x': [1, 2], 'y': ['a', 'b']})\n```")
    tool = panel.locator(".jp-wb-tool").filter(has_text="pd.DataFrame").first
    table = tool.locator(".jp-wb-output table.dataframe")
    table.wait_for(timeout=60_000)
    assert table.locator("tbody tr").count() == 2
    assert "\\n" not in tool.locator(".jp-wb-output").inner_text()
    img = tool.locator(".jp-wb-output img").first
    img.wait_for()
    page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle())
    size = img.evaluate("el => [el.naturalWidth, el.naturalHeight, el.clientWidth, el.clientHeight]")
    # (the inline backend trims the figure's margins: about 240 x 160 pixels)
    assert 150 < size[0] < 300 and size[2:] == size[:2], f"image natural {size[:2]}, shown {size[2:]}"
    assert img.get_attribute("alt"), "an output image has alt text"
    wait_idle(page)
    panel.locator(".jp-wb-assistant").filter(has_text="Here is what it printed").last.scroll_into_view_if_needed()
    shot(page, "10-rendered-reply")
    assert page.blocked == []


KEYWORD_COLOUR = """(el) => {
  const probe = document.createElement('span');
  probe.style.color = 'var(--jp-mirror-editor-keyword-color)';
  el.closest('pre').append(probe);
  const want = getComputedStyle(probe).color;
  probe.remove();
  return {word: getComputedStyle(el).color, keyword: want, plain: getComputedStyle(el.closest('pre')).color};
}"""


def assert_highlighted(block) -> None:
    """`import` in the code block is drawn in the theme's keyword colour, not the block's own."""
    word = block.locator("code.language-python span").filter(has_text=re.compile(r"^import$")).first
    word.wait_for(timeout=30_000)
    colours = word.evaluate(KEYWORD_COLOUR)
    assert colours["word"] == colours["keyword"] != colours["plain"], colours


def test_code_is_highlighted_in_replies_and_tool_cards(page, lab: JupyterProcess):
    """As a notebook highlights a cell: a reply's fenced code and the code of a tool card, in a page
    where no notebook (and so no editor) was ever opened."""
    panel = open_sidebar(page, lab)
    new_session(panel)
    # (a ~~~ fence is not run by the scripted model, which quotes it back in its reply)
    send(panel, "Highlight check\n\n~~~python\nimport os\nprint(os.sep)\n~~~")
    reply = panel.locator(".jp-wb-assistant").filter(has_text="Highlight check")
    reply.wait_for(timeout=60_000)
    assert_highlighted(reply.locator("pre").first)
    wait_idle(page)
    send(panel, "```python\nimport os\nprint(os.sep * 3)\n```")
    tool = panel.locator(".jp-wb-tool").filter(has_text="os.sep * 3").first
    tool.locator(".jp-wb-output").filter(has_text="///").wait_for(timeout=60_000)
    assert_highlighted(tool.locator("pre.jp-wb-code"))
    # the highlighted card keeps its code whole: Copy and Insert act on the text as the model wrote it
    assert tool.locator("pre.jp-wb-code").inner_text().strip() == "import os\nprint(os.sep * 3)"
    wait_idle(page)
    shot(page, "17-highlighted-code")
    assert page.blocked == []


def test_a_result_logged_as_a_string_shows_as_its_text(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    panel.locator(f'.jp-wb-session[data-session-id="{LEGACY_SESSION}"]').click()
    out = panel.locator('.jp-wb-tool[data-tool-use-id="toolu_legacy"] .jp-wb-output')
    out.locator("pre, .jp-RenderedText").filter(has_text="0  1  a").first.wait_for(timeout=30_000)
    text = out.inner_text()
    assert LEGACY_TEXT in text, text
    assert '"' not in text and "\\n" not in text, f"the result shows JSON-quoted: {text!r}"


def test_insert_code_into_the_active_notebook_and_run_it(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    widen_sidebar(page, 120)
    page.evaluate("window.jupyterapp.commands.execute('notebook:create-new', {kernelName: 'python3'})")
    nb = page.locator(".jp-NotebookPanel").first
    nb.locator(".jp-Cell").first.wait_for(timeout=60_000)
    page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
        state="attached", timeout=120_000)
    new_session(panel)
    send(panel, "```python\nprint('from the agent', 6*7)\n```")
    tool = panel.locator(".jp-wb-tool").filter(has_text="from the agent").first
    tool.locator(".jp-wb-stdout").filter(has_text="from the agent 42").wait_for(timeout=60_000)
    wait_idle(page)
    # Copy puts the code on the clipboard.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    tool.get_by_role("button", name="Copy code").click()
    tool.locator(".jp-wb-code-status").filter(has_text="Copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == "print('from the agent', 6*7)"
    tool.get_by_role("button", name="Insert code as a new notebook cell").click()
    tool.locator(".jp-wb-code-status").filter(has_text="Inserted").wait_for()
    cells = nb.locator(".jp-Cell")
    assert cells.count() == 2
    assert "print('from the agent', 6*7)" in cells.nth(1).locator(".jp-InputArea-editor").inner_text()
    # The inserted cell is the active one: run it in the notebook's own kernel.
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-cell')")
    cells.nth(1).locator(".jp-OutputArea-output").filter(has_text="from the agent 42").wait_for(timeout=120_000)
    # The assistant's Markdown code blocks have the same buttons.
    send(panel, "no code here")
    reply = panel.locator(".jp-wb-assistant").filter(has_text="You said: no code here")
    reply.wait_for(timeout=60_000)
    wait_idle(page)
    tool.scroll_into_view_if_needed()
    shot(page, "11-notebook-cell")
    # Closed, so the next page's restored workspace does not reopen it (and ask for a kernel).
    page.evaluate("() => { window.jupyterapp.commands.execute('application:close-all'); }")
    page.locator(".jp-Dialog").get_by_role("button", name="Discard").click()
    nb.wait_for(state="detached", timeout=30_000)
    assert page.blocked == []


def test_open_the_session_as_a_notebook(page, lab: JupyterProcess):
    """*Open as notebook* saves the session's code and outputs as a new .ipynb in the Jupyter root (never over
    an existing file) and opens it: the agent's cell with its recorded output."""
    import nbformat

    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    send(panel, "```python\nprint('exported', 6*7)\n```")
    panel.locator(".jp-wb-tool .jp-wb-stdout").filter(has_text="exported 42").wait_for(timeout=60_000)
    wait_idle(page)
    title = panel.locator(".jp-wb-session.jp-mod-selected").inner_text().split("\n")[0]
    before = set(lab.root.glob("*.ipynb"))
    for n in (1, 2):  # the second time, a new file beside the first
        panel.get_by_role("button", name="Open as notebook").click()
        page.wait_for_function(f"() => document.querySelectorAll('.jp-NotebookPanel').length >= {n}", timeout=60_000)
        shown = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output")  # the tab just opened
        shown.filter(has_text="exported 42").first.wait_for(timeout=60_000)
        # not modified at once (issue 25 papercut): its kernel started and JupyterLab wrote the kernel's spec and
        # language into the notebook's metadata, which held the same already
        dirty = page.evaluate("""async () => {
            const w = window.jupyterapp.shell.currentWidget;
            await w.sessionContext.ready;
            await w.sessionContext.session.kernel.info;
            await w.sessionContext.session.kernel.spec;
            await new Promise(r => setTimeout(r, 0));
            return [w.context.model.dirty, JSON.stringify(w.context.model.getMetadata('kernelspec'))];
        }""")
        assert dirty[0] is False, f"the opened notebook is modified at once (kernelspec now {dirty[1]})"
    made = sorted(set(lab.root.glob("*.ipynb")) - before)
    assert len(made) == 2, (made, title)
    for path in made:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        (code,) = [c for c in nb.cells if c.cell_type == "code"]
        assert code.source == "print('exported', 6*7)" and code.outputs[0]["text"] == "exported 42\n"
        assert nb.metadata["workbench"]["session"] == sid
    shot(page, "16-open-as-notebook")
    page.evaluate("() => { window.jupyterapp.commands.execute('application:close-all'); }")
    page.wait_for_function("() => !document.querySelector('.jp-NotebookPanel')", timeout=30_000)  # nothing to save
    assert page.blocked == []


LONG = "```python\nimport time\ntime.sleep(120)\n```"


def test_stop_esc_and_retry_after_a_rejected_send(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    send(panel, "```python\nprint('warm')\n```")
    wait_idle(page)
    panel.get_by_role("button", name="Restart hands").click()
    panel.locator(".jp-wb-note").filter(has_text="hands restarted").wait_for(timeout=60_000)

    send(panel, LONG)
    panel.locator(".jp-wb-tool.jp-mod-running").wait_for(timeout=60_000)

    # Enter while the turn runs sends nothing (the button under it is Stop, not Send).
    panel.locator(".jp-wb-input").fill("and another thing")
    panel.locator(".jp-wb-input").press("Enter")
    page.wait_for_timeout(1500)  # a request the keypress might have sent has time to land
    assert panel.locator(".jp-wb-banner").is_hidden(), panel.locator(".jp-wb-banner").inner_text()
    assert user_messages(lab, sid) == ["```python\nprint('warm')\n```", LONG]
    assert panel.get_by_role("button", name="Interrupt").is_enabled()
    stop = panel.locator(".jp-wb-composer button")
    assert stop.inner_text() == "Stop" and stop.is_enabled()
    # The hands are busy during the call, restarted or not.
    page.locator(".jp-wb-hands-label[data-state='busy']").wait_for(timeout=30_000)

    # A send the server refuses (its turn runs: 409) leaves Stop in place: the turn still runs.
    page.evaluate("""() => {
      const panel = [...window.jupyterapp.shell.widgets('left')].find(w => w.id === 'jp-workbench');
      return panel.send('a message the server refuses', false);
    }""")
    panel.locator(".jp-wb-banner").filter(has_text="running").wait_for()
    assert stop.inner_text() == "Stop" and stop.is_enabled()
    assert panel.get_by_role("button", name="Interrupt").is_enabled()
    shot(page, "12-stop-after-rejected-send")
    stop.click()
    panel.locator(".jp-wb-note").filter(has_text="turn ended: interrupted").wait_for(timeout=60_000)
    wait_idle(page)

    # Retry sends the same message again as a new one; Esc stops it.
    panel.get_by_role("button", name="Retry").click()
    page.wait_for_function("document.querySelector('#jp-workbench .jp-wb-composer button').textContent === 'Stop'", timeout=60_000)
    panel.locator(".jp-wb-tool.jp-mod-running").wait_for(timeout=60_000)
    assert user_messages(lab, sid)[-1] == LONG and len(user_messages(lab, sid)) == 3
    panel.locator(".jp-wb-input").press("Escape")
    panel.locator(".jp-wb-note").filter(has_text="turn ended: interrupted").nth(1).wait_for(timeout=60_000)
    wait_idle(page)
    assert panel.locator(".jp-wb-input").input_value() == "and another thing", "the draft is kept"


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two CSS rgb()/rgba() colours (alpha ignored)."""
    def lum(c: str) -> float:
        r, g, b = (float(v) / 255 for v in c[c.index("(") + 1:c.index(")")].split(",")[:3])
        f = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in (r, g, b)]
        return 0.2126 * f[0] + 0.7152 * f[1] + 0.0722 * f[2]
    a, b = sorted((lum(fg), lum(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def test_keyboard_contrast_and_axe(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    widen_sidebar(page, 260)
    # Send keeps readable colours under the pointer (it was white on light grey).
    send_button = panel.locator(".jp-wb-composer button")
    send_button.hover()
    fg, bg = send_button.evaluate("el => [getComputedStyle(el).color, getComputedStyle(el).backgroundColor]")
    assert contrast(fg, bg) >= 3.0, f"Send on hover: {fg} on {bg}"
    # The shortcut starts a new session; the composer is labelled and takes the focus.
    before = panel.locator(".jp-wb-session").count()
    page.keyboard.press("Control+Shift+Y")
    page.wait_for_function(f"document.querySelectorAll('#jp-workbench .jp-wb-session').length > {before}", timeout=30_000)
    sid = panel.locator(".jp-wb-session.jp-mod-selected").get_attribute("data-session-id")
    assert panel.get_by_role("textbox", name="Message to the agent").count() == 1
    send(panel, MARKDOWN + "\n\n```python\n"
                "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 1.5))\nplt.plot([1, 3, 2])\nplt.show()\n```")
    panel.locator(".jp-wb-tool .jp-wb-output img").first.wait_for(timeout=60_000)
    wait_idle(page)

    send_button.hover()
    fg, bg = send_button.evaluate("el => [getComputedStyle(el).color, getComputedStyle(el).backgroundColor]")
    assert contrast(fg, bg) >= 3.0, f"Send on hover, after a turn: {fg} on {bg}"

    # Sessions: one is in the tab order, arrow keys move, Enter opens, aria-selected tells which.
    selected = panel.locator(f'.jp-wb-session[data-session-id="{sid}"]')
    assert selected.get_attribute("aria-selected") == "true" and selected.get_attribute("tabindex") == "0"
    selected.focus()
    page.keyboard.press("ArrowDown")
    other = page.evaluate("document.activeElement.dataset.sessionId")
    assert other and other != sid
    page.keyboard.press("Enter")
    panel.locator(f'.jp-wb-session[data-session-id="{other}"][aria-selected="true"]').wait_for()
    assert selected.get_attribute("aria-selected") == "false"
    page.keyboard.press("ArrowUp")
    page.keyboard.press("Enter")
    selected.and_(panel.locator('[aria-selected="true"]')).wait_for()
    panel.locator(".jp-wb-tool .jp-wb-output img").first.wait_for(timeout=60_000)
    assert all(panel.locator("img").evaluate_all("els => els.map(e => !!e.getAttribute('alt'))"))

    found = axe_violations(page, "#jp-workbench")
    artifact("axe-sidebar.json").write_text(json.dumps(found, indent=1))
    assert found == [], json.dumps(found, indent=1)
    shot(page, "13-sidebar")

    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    page.locator("#jupyterlab-splash").wait_for(state="detached")
    found = axe_violations(page, "#jp-workbench")
    assert found == [], json.dumps(found, indent=1)
    shot(page, "14-dark")
    assert page.blocked == []


AGENT_PLOT = ("%%agent --new --model scripted\n```python\nimport matplotlib.pyplot as plt\n"
              "plt.figure(figsize=(2.4, 1.6), dpi=100)\nplt.plot([1, 3, 2])\nplt.show()\n```")


def test_a_plot_in_an_agent_cell_keeps_its_natural_size(page, lab: JupyterProcess):
    open_sidebar(page, lab)
    page.evaluate("window.jupyterapp.commands.execute('notebook:create-new', {kernelName: 'python3'})")
    nb = page.locator(".jp-NotebookPanel").first
    nb.locator(".jp-Cell").first.wait_for(timeout=60_000)
    page.evaluate("""(cells) => {
      const model = window.jupyterapp.shell.currentWidget.content.model.sharedModel;
      model.getCell(0).setSource(cells[0]);
      model.insertCell(1, {cell_type: 'code', source: cells[1]});
    }""", ["%load_ext workbench", AGENT_PLOT])
    page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
        state="attached", timeout=120_000)
    for i in (0, 1):
        page.evaluate("""(i) => {
          const nb = window.jupyterapp.shell.currentWidget.content;
          nb.activeCellIndex = i;
          window.jupyterapp.commands.execute('notebook:run-cell');
        }""", i)
        if i == 0:  # a loaded machine: kernel start and the extension import
            ran = nb.locator(".jp-Cell").first.locator(".jp-InputPrompt").filter(has_text=re.compile(r"\[\d+\]"))
            try:
                ran.wait_for(timeout=60_000)
            except Exception:  # the run was asked for before the kernel took it: ask again, as a person would
                page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 0;"
                              " window.jupyterapp.commands.execute('notebook:run-cell'); }")
                try:
                    ran.wait_for(timeout=120_000)
                except Exception as err:
                    shot(page, "agent-cell-load-failed")
                    raise AssertionError(nb.inner_text()[-3000:]) from err
    # The cell ends by updating its display with the final view (handle.update in the magic), which draws every widget
    # again: the image is measured once the cell has finished, not while its first drawing is about to be replaced.
    agent_cell = nb.locator(".jp-Cell").nth(1)
    img = agent_cell.locator(".jp-OutputArea-output img").first
    try:
        agent_cell.locator(".jp-InputPrompt").filter(has_text=re.compile(r"\[\d+\]")).wait_for(timeout=180_000)
        img.wait_for(timeout=120_000)
    except Exception as err:
        shot(page, "agent-cell-failed")
        raise AssertionError(nb.inner_text()[-3000:]) from err
    page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle())
    size = img.evaluate("el => [el.naturalWidth, el.naturalHeight, el.clientWidth, el.clientHeight]")
    assert 150 < size[0] < 300 and size[2:] == size[:2], f"image natural {size[:2]}, shown {size[2:]} (stretched)"
    img.scroll_into_view_if_needed()
    shot(page, "15-agent-cell")
    page.evaluate("() => { window.jupyterapp.commands.execute('application:close-all'); }")
    page.locator(".jp-Dialog").get_by_role("button", name="Discard").click()
    assert page.blocked == []
