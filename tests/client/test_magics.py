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


def test_the_cell_shows_the_prompt_with_its_lines_and_escaped():
    """The `you:` line of a %%agent cell keeps the prompt's lines (a code fence ran into one line) and its markup as text."""
    from workbench.client.render import ChatView

    view = ChatView("s1", prompt="Run this:\n```python\nprint('<b>x</b>')\n```")
    you = view.body.children[0].value
    assert "white-space: pre-wrap" in you and "Run this:\n```python\n" in you
    assert "&lt;b&gt;x&lt;/b&gt;" in you and "<b>x</b>" not in you
