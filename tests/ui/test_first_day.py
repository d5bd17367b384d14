"""A researcher's first day in the sidebar (issue 25): math typeset, the user's own Markdown rendered, the
offline model's summaries keeping a printed frame's layout, Stop keeping what a call printed, a missing
module that says how to get it, and a real key's models in the picker. A real `jupyter lab`, driven in
headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from wbui import CHROMIUM, JupyterProcess, lab_api, new_session, open_sidebar, send, shot, wait_idle

from workbench.testing import FakeMessagesAPI, Reply

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")


def test_latex_is_typeset_and_the_users_message_is_rendered_as_markdown(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    new_session(panel)
    send(panel, "Euler check: $e^{i\\pi}+1=0$ and **bold** words")
    reply = panel.locator(".jp-wb-assistant").filter(has_text="Euler check")
    reply.wait_for(timeout=60_000)
    # JupyterLab's typesetter (MathJax) replaced the source with typeset math, in the reply and the message
    reply.locator("mjx-container").first.wait_for(timeout=30_000)
    user = panel.locator(".jp-wb-user").filter(has_text="Euler check")
    user.locator("mjx-container").first.wait_for(timeout=30_000)
    user.locator("strong").filter(has_text="bold").wait_for()
    for where in (reply, user):
        assert "$e^{" not in where.inner_text(), where.inner_text()
    wait_idle(page)
    shot(page, "first-day-latex")
    assert page.blocked == []


FRAME = "```python\nimport pandas as pd\nprint(pd.DataFrame({'x': [1, 2], 'y': ['a', 'b']}))\n1 / 0\n```"


def test_the_offline_models_summary_keeps_a_printed_frame_and_traceback_as_printed(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    new_session(panel)
    send(panel, FRAME)
    reply = panel.locator(".jp-wb-assistant").filter(has_text="Here is what it printed")
    reply.wait_for(timeout=90_000)
    block = reply.locator("pre").first
    block.wait_for()
    text = block.inner_text()
    assert "   x  y\n0  1  a\n1  2  b" in text, text  # the frame's columns, on their lines
    assert "ZeroDivisionError" in text and "Traceback" in text, text
    assert reply.locator("hr, h1, h2").count() == 0, "a traceback's rule of dashes became Markdown"
    wait_idle(page)
    assert page.blocked == []


LOOP = "```python\nimport time\nfor i in range(600):\n    print('step', i, flush=True)\n    time.sleep(0.25)\n```"


def test_stop_keeps_what_the_call_printed_on_screen_and_after_a_reload(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    sid = new_session(panel)
    send(panel, LOOP)
    card = panel.locator(".jp-wb-tool").filter(has_text="range(600)").first
    card.locator(".jp-wb-live").filter(has_text="step 3\n").wait_for(timeout=90_000)
    panel.locator(".jp-wb-composer button").filter(has_text="Stop").click()
    panel.locator(".jp-wb-note").filter(has_text="turn ended: interrupted").wait_for(timeout=60_000)
    wait_idle(page)

    def kept(card) -> str:
        assert "jp-mod-interrupted" in (card.get_attribute("class") or "")
        out = card.locator(".jp-wb-output")
        out.locator(".jp-wb-stderr").filter(has_text="interrupted by the user").wait_for()
        return out.locator(".jp-wb-stdout").inner_text()

    printed = kept(card)
    steps = [int(line.split()[1]) for line in printed.splitlines() if line.startswith("step ")]
    assert steps[:4] == [0, 1, 2, 3] and steps == list(range(len(steps))), printed
    shot(page, "first-day-stopped")
    # the log holds it: the session drawn again from its events shows the same output
    page.reload()
    panel = open_sidebar(page, lab)
    session = panel.locator(f'.jp-wb-session[data-session-id="{sid}"]')
    if "jp-mod-selected" not in (session.get_attribute("class") or ""):
        session.click()
    again = panel.locator(".jp-wb-tool").filter(has_text="range(600)").first
    again.locator(".jp-wb-stdout").filter(has_text="step 3\n").wait_for(timeout=30_000)
    assert kept(again) == printed
    result = next(e for e in lab_api(lab, "GET", f"sessions/{sid}/events")["events"] if e["type"] == "tool_result")
    assert result["payload"]["interrupted"] and "step 3\n" in result["payload"]["observation"]["outputs"][0]["text"]
    assert page.blocked == []


def test_a_missing_module_says_how_to_get_it(page, lab: JupyterProcess):
    panel = open_sidebar(page, lab)
    new_session(panel)
    send(panel, "```python\nimport sklearn\n```")
    card = panel.locator(".jp-wb-tool").filter(has_text="import sklearn").first
    hint = card.locator(".jp-wb-hint")
    hint.wait_for(timeout=90_000)
    text = hint.inner_text()
    assert "`sklearn` is not installed in the hands' Python environment" in text, text
    assert " -m pip install scikit-learn" in text and "restart the hands" in text, text
    # the model read the same line: the offline model quotes what it read
    reply = panel.locator(".jp-wb-assistant").filter(has_text="Here is what it printed")
    reply.filter(has_text="pip install scikit-learn").wait_for(timeout=60_000)
    wait_idle(page)
    shot(page, "first-day-missing-module")
    assert page.blocked == []


@pytest.fixture(scope="module")
def keyed_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[JupyterProcess, FakeMessagesAPI]]:
    """JupyterLab with an API key, at the fake Messages API (which serves the Models API too)."""
    api = FakeMessagesAPI({"claude-opus-5-5": "default", "claude-haiku-5-5": [Reply(text="haiku answers")]}).start()
    proc = JupyterProcess(tmp_path_factory.mktemp("keyed"))
    proc.env.update(ANTHROPIC_API_KEY="sk-test-not-a-real-key", ANTHROPIC_BASE_URL=api.url)
    try:
        yield proc.start(), api
    finally:
        proc.stop()
        api.stop()


def test_with_a_key_the_picker_offers_the_models_the_key_can_use(page, keyed_lab):
    lab, api = keyed_lab
    panel = open_sidebar(page, lab)
    picker = panel.locator("select.jp-wb-model")
    picker.locator("option[value='claude-haiku-5-5']").wait_for(state="attached", timeout=30_000)
    options = picker.locator("option").evaluate_all("os => os.map(o => o.value)")
    assert options == ["claude-opus-5-5", "scripted", "claude-haiku-5-5"], options
    picker.select_option("claude-haiku-5-5")
    sid = new_session(panel)
    send(panel, "hello")
    panel.locator(".jp-wb-assistant").filter(has_text="haiku answers").wait_for(timeout=60_000)
    assert lab_api(lab, "GET", f"sessions/{sid}")["model"] == "claude-haiku-5-5"
    # a name the key cannot use is refused by the server, naming those it can
    refused = httpx.post(f"{lab.url}/workbench/api/sessions", json={"model": "claude-opus-5"}, headers=lab.headers,
                         timeout=30)
    assert refused.status_code == 400 and "it can use: claude-haiku-5-5, claude-opus-5-5" in refused.text, refused.text
    assert api.model_lists == 1, "the server asked the Models API once"
    assert page.blocked == []
