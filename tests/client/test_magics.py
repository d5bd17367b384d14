"""`%agent` text reaches the magic verbatim: a trailing `?` is not IPython's help (a bug of the issue)."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from workbench.client.magics import load_ipython_extension


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    load_ipython_extension(sh)
    load_ipython_extension(sh)  # twice (a %reload_ext): one transform
    yield sh
    InteractiveShell.clear_instance()


@pytest.mark.parametrize("line, text", [
    ("%agent what did you just do?", "what did you just do?"),
    ("%agent df?", "df?"),
    ("%agent what is x??", "what is x??"),
    ("%agent --new what?", "--new what?"),
    ("  %agent it's \"quoted\" \\ and {braces}?", "it's \"quoted\" \\ and {braces}?"),
])
def test_a_question_mark_reaches_agent(shell, line, text):
    code = shell.input_transformer_manager.transform_cell(line + "\n")
    assert "pinfo" not in code
    assert code.strip() == f"get_ipython().run_line_magic('agent', {text!r})"
    assert shell.input_transformer_manager.cleanup_transforms.count(
        shell.input_transformer_manager.cleanup_transforms[-1]) == 1


def test_other_lines_and_cell_magics_are_left_alone(shell):
    t = shell.input_transformer_manager.transform_cell
    assert "pinfo" in t("len?\n")  # help still works for everything else
    assert t("x = 1\n%agent hi\n").splitlines() == ["x = 1", "get_ipython().run_line_magic('agent', 'hi')"]
    body = t("%%agent\nwhat?\n%agent inside?\n")
    assert "run_cell_magic('agent', '', 'what?\\n%agent inside?\\n')" in body
    assert "%agentx" not in t("%agentx y?\n") and "pinfo" in t("%agentx y?\n")


def widgets(box) -> list:
    """Every widget of an ipywidgets tree, depth first."""
    return [box, *(x for child in getattr(box, "children", ()) for x in widgets(child))]


def test_the_cell_shows_the_answer_not_the_prompt_again():
    """The prompt is the cell: the view does not repeat it (the plain-text transcript keeps it, with its lines)."""
    from workbench.client.render import ChatView

    prompt = "Run this:\n```python\nprint('<b>x</b>')\n```"
    view = ChatView("s1", prompt=prompt)
    view.feed({"kind": "event", "event": {"seq": 1, "type": "user_message", "payload": {"text": prompt}}})
    assert all("Run this" not in getattr(x, "value", "") for x in widgets(view.box) if isinstance(getattr(x, "value", None), str))
    assert view.transcript() == f"you: {prompt}"


def turn(view, text: str, code: str, result: dict, stop: str = "end_turn") -> None:
    view.feed({"kind": "event", "event": {"seq": 2, "type": "hands_started", "payload": {"generation": 1, "pid": 4242, "start_ms": 80}}})
    view.feed({"kind": "event", "event": {"seq": 3, "type": "assistant_turn", "payload": {"message": {"content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "t1", "name": "python", "input": {"code": code}}]}}}})
    view.feed({"kind": "event", "event": {"seq": 4, "type": "tool_result", "payload": {"tool_use_id": "t1", "name": "python", **result}}})
    view.feed({"kind": "event", "event": {"seq": 5, "type": "assistant_turn", "payload": {"message": {"content": [
        {"type": "text", "text": text}]}}}})
    view.feed({"kind": "event", "event": {"seq": 6, "type": "turn_ended", "payload": {"stop_reason": stop}}})


def test_the_answer_is_markdown_with_code_highlighted_math_kept_and_markup_escaped():
    import ipywidgets as w

    from workbench.client.render import ChatView

    view = ChatView("s1")
    answer = ("The **mean** is `2`:\n\n```python\nmean = sum(xs) / len(xs)\n```\n\n$e^{i\\pi}+1=0$, costs $5 and $6; "
              "<img src=x onerror=alert(1)> <script>alert(2)</script>")
    turn(view, answer, "print(2)", {"is_error": False, "content": [{"type": "text", "text": "2"}]})
    (shown,) = [x for x in view.body.children if isinstance(x, w.HTMLMath) and "mean" in x.value]
    html = shown.value
    assert "<strong>mean</strong>" in html and "<code>2</code>" in html
    assert '<span style="color: #008000">sum</span>' in html  # Pygments' inline styles: no stylesheet needed
    assert "\\(e^{i\\pi}+1=0\\)" in html and "costs $5 and $6" in html  # math kept whole, money left alone
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;script&gt;" in html and "<img" not in html and "<script" not in html


def test_a_call_is_folded_once_its_result_is_in_and_a_normal_end_leaves_no_status_line():
    import ipywidgets as w

    from workbench.client.render import ChatView

    view = ChatView("s1")
    view.feed({"kind": "event", "event": {"seq": 3, "type": "assistant_turn", "payload": {"message": {"content": [
        {"type": "tool_use", "id": "t1", "name": "python", "input": {"code": "import time\nprint('step 1')"}}]}}}})
    (fold,) = [x for x in view.body.children if isinstance(x, w.Accordion)]
    assert fold.selected_index == 0 and fold.get_title(0) == "python: import time · running"  # open while it runs
    view.feed({"kind": "output", "tool_use_id": "t1", "text": "step 1\n", "state": "running", "elapsed_s": 3, "hands": "busy"})
    assert fold.get_title(0) == "python: import time · running 3 s"
    assert any("step 1" in getattr(x, "value", "") for x in widgets(fold) if isinstance(x, w.HTML))
    view.feed({"kind": "event", "event": {"seq": 4, "type": "tool_result", "payload": {
        "tool_use_id": "t1", "name": "python", "is_error": True, "content": [{"type": "text", "text": "ValueError: no"}]}}})
    assert fold.selected_index is None and fold.get_title(0) == "python: import time · error"
    code = next(x.value for x in widgets(fold) if isinstance(x, w.HTML) and "import" in x.value)
    assert "overflow-x: auto" in code and 'style="color: #008000; font-weight: bold">import</span>' in code
    view.feed({"kind": "event", "event": {"seq": 5, "type": "turn_ended", "payload": {"stop_reason": "end_turn"}}})
    assert view.status.value == ""  # no "turn ended (end_turn) · hands: kernel generation 1 (pid ...)"
    other = ChatView("s2")
    turn(other, "Stopped.", "print(1)", {"is_error": False, "content": [{"type": "text", "text": "1"}]}, stop="max_tokens")
    assert any("[turn ended: max_tokens]" in getattr(x, "value", "") for x in other.body.children)  # a problem is said
