"""Verifiers: grading an attempt (or a delegated child) where the agent cannot reach.

A **python** verifier (`python_verdict`: the one verifier of evals and of delegate checks) runs
in fresh hands of its own (a new kernel from the host's hands factory, never the agent's) with a
workspace of its own, into which the agent's workspace is *copied* after the turn, while every
process of the agent's kernel is stopped (`Hands.frozen`), by the workspace module
(`hands.files.copy_tree`: by descriptor, never through a link). The check's code comes from the
host (a task set loaded before the attempt began, or the parent's call), goes to the kernel as the
cell's text (no file the agent could rewrite), and its verdict comes back on a line marked with a
random nonce that the agent never sees: a file the agent wrote that claims a verdict is just a
file. The kernel starts in a directory holding only the copy's folder; before the check runs, the
copy is taken off `sys.path`, so a `pandas.py` the agent left there is not what `import pandas` finds.

A **rubric** verifier is a second model call with its own prompt (the rubric, the task,
the final answer and the workspace's file list); the grading model answers with JSON.
Both give a `Verdict`: passed, a score in [0, 1] and an explanation.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..brain.models import MessageBuilder
from ..hands import Hands
from ..hands.files import NoWorkspace, copy_tree, list_files
from .tasks import Task

MAX_EXPLANATION_CHARS = 4000
MAX_COPY_BYTES = 512 * 1024 * 1024  # what a workspace copy may hold; the rest is left out, with a note
MAX_COPY_ENTRIES = 20_000  # files, directories and the rest a copy walks; the rest is left out, with a note
MAX_LISTED_FILES = 200
MAX_LISTED_ENTRIES = 2_000  # entries walked to list the files for a grading model


@dataclass
class Verdict:
    """A verifier's result: passed, a score in [0, 1] and why."""

    passed: bool
    score: float
    explanation: str
    kind: str = "python"
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _clip(text: Any, limit: int = MAX_EXPLANATION_CHARS) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"


def _score(value: Any, passed: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 1.0 if passed else 0.0
    return min(1.0, max(0.0, float(value)))


# -- python verifiers ---------------------------------------------------------------------

# The cell the verifier kernel runs. Only literals are put into it (json.dumps of strings).
HARNESS = """\
import json as _wb_json, os as _wb_os, sys as _wb_sys, traceback as _wb_tb
_wb_os.chdir("workspace")
_wb_here = _wb_os.getcwd()
_wb_sys.path[:] = [p for p in _wb_sys.path if p not in ("", ".") and _wb_os.path.abspath(p) != _wb_here
                   and _wb_os.path.abspath(p) != _wb_os.path.dirname(_wb_here)]
_wb_ns = {{"__name__": "__verifier__", "answer": _wb_json.loads({answer})}}
_wb_v = {{"passed": False, "score": None, "explanation": ""}}
try:
    exec(compile(_wb_json.loads({code}), "<verifier>", "exec"), _wb_ns)
    _wb_v["passed"] = bool(_wb_ns.get("passed", True))
    _wb_v["score"] = _wb_ns.get("score")
    _wb_v["explanation"] = str(_wb_ns.get("explanation", "all checks passed" if _wb_v["passed"] else "the check failed"))
except AssertionError as _wb_e:
    _wb_v["explanation"] = str(_wb_e) or "an assertion failed: " + _wb_tb.format_exc(limit=-1).strip().splitlines()[-2].strip()
except BaseException as _wb_e:
    _wb_v["explanation"] = f"the check raised {{type(_wb_e).__name__}}: {{_wb_e}}"
if not isinstance(_wb_v["score"], (int, float)) or isinstance(_wb_v["score"], bool) or not abs(_wb_v["score"]) <= 1e308:
    _wb_v["score"] = None
print({nonce} + _wb_json.dumps(_wb_v, default=str))
"""


def harness_code(check: str, answer: str, nonce: str) -> str:
    """The verifier's cell: the check wrapped so that its verdict comes back on a line marked with `nonce`."""
    return HARNESS.format(answer=json.dumps(json.dumps(answer)), code=json.dumps(json.dumps(check)), nonce=json.dumps(nonce))


def read_verdict(out: str, nonce: str) -> dict[str, Any] | None:
    """The verdict the harness printed (the last line marked with nonce), or None."""
    for line in reversed(out.splitlines()):
        if line.startswith(nonce):
            try:
                v = json.loads(line[len(nonce):], parse_constant=_refuse)
            except (ValueError, RecursionError):
                return None
            return v if isinstance(v, dict) else None
    return None


async def python_verdict(hands_factory: Any, agent: Hands, code: str, answer: str, *, label: str,
                         timeout: float | None = None, limit_bytes: int = MAX_COPY_BYTES,
                         max_entries: int = MAX_COPY_ENTRIES) -> Verdict:
    """Run the check `code` in fresh hands over a copy of the `agent` hands' workspace, taken while the agent's
    processes are stopped; `details` has duration_ms and copy_notes (what the copy left out, and why)."""
    t0 = time.perf_counter()
    details: dict[str, Any] = {"duration_ms": 0.0, "copy_notes": []}

    def verdict(passed: bool, score: float, explanation: str) -> Verdict:
        details["duration_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        details["copy_notes"] = details["copy_notes"][:20]
        return Verdict(passed, score, explanation, "python", details)

    if hands_factory is None:
        return verdict(False, 0.0, "not checked: this host runs no code")
    source = await agent.workspace()
    if source is None or not source.is_dir():
        return verdict(False, 0.0, "not checked: there is no workspace to check on this machine (no code ran, "
                                   "its workspace did not survive a restart, or its kernels run on a gateway)")
    # one call, then closed: a spare kernel beside it would boot for nothing (as many kernels again as checks)
    config = {"hands": {"spare": False, **({"timeout": float(timeout)} if timeout else {})}}
    hands = hands_factory(label, config, None, None)  # no log of their own: the verdict is the record
    try:
        try:
            root = await hands.workspace(create=True)
        except NoWorkspace as e:  # e.g. this host's hands refuse to run code (see its sandbox status)
            return verdict(False, 0.0, f"not checked: {e}")
        assert root is not None, "workspace(create=True) makes one or raises"
        async with agent.frozen() as notes:
            # into a folder of the kernel's directory: `python -m` puts that directory on sys.path at start,
            # so an `ipykernel_launcher.py` or `sitecustomize.py` the agent wrote must not be in it
            details["copy_notes"] = notes + await asyncio.to_thread(
                copy_tree, source, root / "workspace", limit_bytes=limit_bytes, max_entries=max_entries,
                owner=hands.workspace_owner())
        nonce = "WBVERDICT-" + secrets.token_hex(16)
        obs = await hands.execute(harness_code(code, answer, nonce), timeout=timeout)
    finally:
        await hands.shutdown()
    v = read_verdict(obs.stdout, nonce)
    if v is None:
        return verdict(False, 0.0, f"the verifier did not finish: {_clip(obs.text(), 1000)}")
    passed = bool(v.get("passed"))
    return verdict(passed, _score(v.get("score"), passed), _clip(v.get("explanation", "")))


# -- rubric verifiers ---------------------------------------------------------------------

GRADER_SYSTEM = (
    "You grade the work of an AI agent against a rubric. Judge only what is shown. Reply with one JSON object "
    'and nothing else: {"passed": true|false, "score": a number from 0 to 1, "explanation": "one or two sentences"}.'
)
JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def listing(workspace: Path) -> str:
    """The workspace's files with their sizes (at most MAX_LISTED_FILES; links never followed), for the grading model."""
    if not workspace.is_dir():
        return "(no files)"
    entries, cut = list_files(workspace, MAX_LISTED_ENTRIES)
    files = [f for f in entries if f["type"] == "file"]
    rows = [f"{f['path']} ({f['bytes']} bytes)" for f in files[:MAX_LISTED_FILES]]
    if cut or len(files) > MAX_LISTED_FILES:
        rows.append("…")
    return "\n".join(rows) or "(no files)"


def grader_request(task: Task, answer: str, files: str, model: str) -> dict[str, Any]:
    """The grading model's request: its own system prompt, the rubric, the task, the answer and the files."""
    text = (f"<rubric>\n{task.verifier.rubric}\n</rubric>\n\n<task>\n{task.prompt}\n</task>\n\n"
            f"<answer>\n{answer}\n</answer>\n\n<files>\n{files}\n</files>")
    return {"model": model, "max_tokens": 2000, "system": GRADER_SYSTEM, "tools": [],
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def parse_grade(text: str) -> tuple[bool, float, str] | None:
    """(passed, score, explanation) from the grading model's reply, or None when it is not the JSON asked for."""
    m = JSON_OBJECT.search(text)
    if m is None:
        return None
    try:
        v = json.loads(m.group(0), parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None
    if not isinstance(v, dict) or not isinstance(v.get("passed"), bool):
        return None
    return v["passed"], _score(v.get("score"), v["passed"]), _clip(v.get("explanation", ""))


async def rubric_verdict(model: Any, task: Task, answer: str, workspace: Path) -> Verdict:
    """Ask the grading model; the request and its reply are in the verdict's details (and so in the log)."""
    t0 = time.perf_counter()
    files = await asyncio.to_thread(listing, workspace)
    request = grader_request(task, answer, files, model.name)  # the model sends the API its own name
    builder = MessageBuilder()
    try:
        async for ev in model.stream(request):
            builder.feed(ev)
        message = builder.result()
    except Exception as e:  # the grader's failure is this verdict's failure, never the run's
        return Verdict(False, 0.0, f"the grading model failed: {type(e).__name__}: {_clip(e, 500)}", "rubric",
                       {"grader": {"model": model.name, "request": request}})
    reply = "".join(b.get("text", "") for b in message.get("content", []) if b.get("type") == "text")
    details = {"duration_ms": round((time.perf_counter() - t0) * 1000, 1),
               "grader": {"model": model.name, "request": request, "reply": _clip(reply, 20_000), "usage": message.get("usage")}}
    graded = parse_grade(reply)
    if graded is None:
        return Verdict(False, 0.0, f"the grading model did not answer with the JSON asked for: {_clip(reply, 300)}", "rubric", details)
    return Verdict(*graded, "rubric", details)
