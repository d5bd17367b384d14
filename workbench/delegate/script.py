"""Scripts of the offline scripted model for delegation: a parent (`scripted:delegate`), a child (`scripted:worker`).

`scripted:delegate` runs the ```python blocks of the user's message first (to make files it may
pass), then makes one `delegate` call per ```json block (several blocks: several calls in one
response, which run concurrently), then reports what the children answered.

`scripted:worker` runs the ```python blocks of its task one model response at a time (so turn
limits bite), then answers with the last output. A task that says MODEL_ERROR gets a model error. Told that
its check failed (a later turn, outcome mode), it runs its task's blocks again; asked to grade a rubric (the
grader's request), it answers as the scripted grader.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..plugins.models import FatalModelError, Reply, is_grading, last_tool_output, position, scripted_grader, user_text

# the closing fence starts a line: a prompt inside the JSON may hold fences of its own (JSON escapes its newlines)
CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.S)  # named: a ```json block is not code
JSON_BLOCK = re.compile(r"```json[ \t]*\n(.*?)\n```[ \t]*(?:\n|$)", re.S)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"unparsed": text[:1000]}  # passed on as it is: the tool says what is wrong


def delegate_script(request: dict[str, Any]) -> Reply:
    """Make files, delegate (one call per ```json block), then report the children's answers."""
    _, step, text = position(request)
    code = [b.strip() for b in CODE_BLOCK.findall(text)]
    calls = [("delegate", _json(b)) for b in JSON_BLOCK.findall(text)]
    if code and step == 0:
        return Reply(thinking="", text="First I'll prepare the files.", code=code)
    if calls and step == (1 if code else 0):
        return Reply(thinking="", text=f"I'll delegate this in {len(calls)} call(s).", tool_calls=calls)
    if not calls:
        return Reply(text='Give me ```json blocks of delegate input, e.g. {"tasks": [{"prompt": "..."}]}.')
    return Reply(text="The children reported:\n\n" + last_tool_output(request))


def worker_script(request: dict[str, Any]) -> Reply:
    """Run the task's ```python blocks one response at a time, then answer with the last output."""
    if is_grading(request):
        return scripted_grader(request)
    turn, step, text = position(request)
    if "MODEL_ERROR" in text:
        raise FatalModelError("the scripted worker fails on purpose (its task said MODEL_ERROR)", status=500)
    if turn > 0:  # a check's verdict came back: try the task again
        text = next((user_text(m) for m in request.get("messages", []) if m.get("role") == "user"), text)
    blocks = [b.strip() for b in CODE_BLOCK.findall(text)]
    if step < len(blocks):
        return Reply(text=f"Step {step + 1} of {len(blocks)}.", code=[blocks[step]])
    out = last_tool_output(request).strip()
    return Reply(text=f"Final answer: {out}" if blocks else f"Final answer: I was asked: {text.strip()[:300]}")
