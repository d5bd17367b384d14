"""A session as a notebook (workbench/export.py): from a real session's log, through the CLI, and from hostile
events; the result is always a valid nbformat 4 notebook."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace

import nbformat
import pytest

from wbsupport import WORKBENCH, cli_env

from workbench.export import MAX_MARKDOWN, session_notebook

CODE_1 = ("import base64, io\nfrom PIL import Image as P\nfrom IPython.display import Image, display\n"
          "b = io.BytesIO(); P.new('RGB', (6, 4), 'red').save(b, 'PNG')\nprint('hello from the kernel')\n"
          "display(Image(b.getvalue()))\n21 * 2")
CODE_2 = "raise ValueError('<script>alert(1)</script>')"


def wb(*args: str, env: dict | None = None):
    import subprocess

    return subprocess.run([*WORKBENCH, *args], capture_output=True, text=True, timeout=300, env=env or cli_env(
        WORKBENCH_HANDS_BACKEND="local"))


def valid(nb: dict) -> nbformat.NotebookNode:
    node = nbformat.from_dict(nb)
    nbformat.validate(node)
    return node


@pytest.mark.slow  # CLI subprocesses and a kernel
def test_a_session_exports_its_code_and_outputs_as_a_valid_notebook(tmp_path):
    db = str(tmp_path / "wb.duckdb")
    assert wb("run", f"```python\n{CODE_1}\n```", "--session", "s1", "--db", db).returncode == 0
    assert wb("run", f"```python\n{CODE_2}\n```", "--session", "s1", "--db", db).returncode == 0
    p = wb("export", "s1", "--ipynb", "--db", db)
    assert p.returncode == 0, p.stderr
    nb = valid(json.loads(p.stdout))
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in code] == [CODE_1, CODE_2]
    kinds = [o.output_type for o in code[0].outputs]
    assert kinds == ["stream", "display_data", "execute_result"], kinds
    assert code[0].outputs[0].text == "hello from the kernel\n"
    assert "image/png" in code[0].outputs[1].data and code[0].outputs[2].data["text/plain"] == "42"
    assert code[1].outputs[0].output_type == "error" and code[1].outputs[0].ename == "ValueError"
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "**User:**" in md and "**Agent:**" in md and "Session `s1`" in md
    assert nb.metadata.workbench.session == "s1"
    # the same notebook from the events the plain export gives (what a server's client builds it from)
    assert wb("export", "nope", "--ipynb", "--db", db).returncode == 2


def ev(seq: int, type: str, payload) -> SimpleNamespace:
    return SimpleNamespace(seq=seq, type=type, payload=payload, ts=datetime.now(UTC))


def test_hostile_events_still_give_a_valid_notebook():
    events = [
        ev(1, "session_created", {"title": "x"}),
        ev(2, "user_message", {"text": "# heading\n<img src=x onerror=alert(1)>" + "z" * (MAX_MARKDOWN + 10)}),
        ev(3, "user_message", "not a dict"),
        ev(4, "assistant_turn", {"message": {"content": [
            "junk", {"type": "text", "text": "   "}, {"type": "tool_use", "id": "t1", "name": "python", "input": "no"},
            {"type": "tool_use", "id": "t2", "name": "python", "input": {"code": "print(1)"}},
            {"type": "tool_use", "id": "t3", "name": "python", "input": {"code": 5}},
            {"type": "tool_use", "id": "t4", "name": "delegate", "input": {"code": "not python"}},
            {"type": "tool_use", "id": "t5", "name": "python", "input": {"code": "old"}}]}}),
        ev(5, "assistant_turn", {"message": None}),
        ev(6, "tool_result", {"tool_use_id": "t2", "observation": {"outputs": [
            {"output_type": "stream", "name": "weird", "text": "dropped"},
            {"output_type": "stream", "name": "stdout", "text": 5},
            {"output_type": "display_data", "data": "not a bundle"},
            {"output_type": "display_data", "data": {"text/plain": "ok"}, "display_id": "d", "updated": True, "svg_png": "x"},
            {"output_type": "error", "ename": None, "evalue": {"deep": 1}, "traceback": ["a", 3]},
            {"output_type": "set_next_input", "text": "x"}, {"output_type": "unknown"}, "junk"]}}),
        ev(7, "tool_result", {"tool_use_id": "t5", "content": [{"type": "text", "text": "from an old log"}], "is_error": True}),
        ev(8, "tool_result", {"tool_use_id": "never-asked", "observation": {"outputs": []}}),
    ]
    nb = valid(session_notebook({"id": "h", "title": "\n\n### a\ntitle <b>", "model": "m"}, events))
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in code] == ["print(1)", "old"]
    assert [o.output_type for o in code[0].outputs] == ["display_data", "error"]
    assert code[0].outputs[0].data == {"text/plain": "ok"} and "display_id" not in code[0].outputs[0]
    assert code[0].outputs[1].ename == "" and code[0].outputs[1].traceback == ["a"]
    assert code[1].outputs[0].name == "stderr" and code[1].outputs[0].text == "from an old log"
    first = nb.cells[0].source.splitlines()[0]
    assert first == "# a title <b>"  # one line: a title cannot open a heading of its own or break the cell
    assert "characters cut" in nb.cells[1].source and len(nb.cells[1].source) < MAX_MARKDOWN + 100


@pytest.mark.parametrize("title", ["", None])
def test_a_session_with_no_code_is_a_notebook_of_one_cell(title):
    nb = valid(session_notebook({"id": "e", "title": title}, []))
    assert len(nb.cells) == 1 and nb.cells[0].source.startswith("# e")
