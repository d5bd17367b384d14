"""Verifiers: grading an attempt where the agent cannot reach.

A **python** verifier runs in fresh hands of its own (a new kernel from the host's hands
factory, never the agent's) whose working directory holds a *copy* of the agent's
workspace, taken after the turn. The check's code comes from the task set the runner
loaded before the attempt began, goes to the kernel as the cell's text (no file the agent
could rewrite), and its verdict comes back on a line marked with a random nonce that the
agent never sees: a file the agent wrote that claims a verdict is just a file. Before the
check runs, the workspace is taken off `sys.path`, so a `pandas.py` the agent left there
is not what `import pandas` finds.

A **rubric** verifier is a second model call with its own prompt (the rubric, the task,
the final answer and the workspace's file list); the grading model answers with JSON.
Both give a `Verdict`: passed, a score in [0, 1] and an explanation.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..brain.models import MessageBuilder
from .tasks import Task

MAX_EXPLANATION_CHARS = 4000
MAX_COPY_BYTES = 512 * 1024 * 1024  # what a workspace copy may hold; the rest is left out, with a note
MAX_LISTED_FILES = 200


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


# -- the copy of the workspace ------------------------------------------------------------


def copy_workspace(src: Path, dst: Path, *, limit: int = MAX_COPY_BYTES, owner: tuple[int, int] | None = None) -> list[str]:
    """Copy regular files and directories of src into dst (symlinks as links, never followed; FIFOs, sockets
    and devices left out); returns notes on what was left out."""
    notes: list[str] = []
    total = 0
    dst.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(src, followlinks=False):
        rel = Path(root).relative_to(src)
        here = dst / rel
        for name in sorted(dirs + files):
            s, d = Path(root) / name, here / name
            try:
                st = s.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
                if name in dirs:
                    dirs.remove(name)  # os.walk would not follow it; say so explicitly
            elif stat.S_ISDIR(st.st_mode):
                d.mkdir(exist_ok=True)
            elif stat.S_ISREG(st.st_mode):
                if total + st.st_size > limit:
                    notes.append(f"{rel / name}: left out (the copy would pass {limit:,} bytes)")
                    continue
                total += st.st_size
                try:
                    shutil.copyfile(s, d, follow_symlinks=False)
                except OSError as e:
                    notes.append(f"{rel / name}: not copied ({e.strerror})")
            else:
                notes.append(f"{rel / name}: left out (not a regular file)")
    if owner is not None:
        for root, dirs, files in os.walk(dst):
            for name in [*dirs, *files, ""]:
                os.lchown(Path(root) / name, *owner)
    return notes


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


async def python_verdict(hands_factory: Any, task: Task, answer: str, workspace: Path, check_dir: Path, label: str) -> Verdict:
    """Run the task's check in fresh hands over a copy of `workspace` made in `check_dir`."""
    t0 = time.perf_counter()
    nonce = "WBVERDICT-" + secrets.token_hex(16)
    config = {"hands": {"workdir": str(check_dir), "timeout": float(task.verifier.timeout)}}
    hands = hands_factory(label, config, None, None)
    try:
        owner = hands.workspace_owner()  # the verifier's sandbox uid (its hands lease one)
        notes = await asyncio.to_thread(copy_workspace, workspace, check_dir / "workspace", owner=owner)
        if owner is not None:
            os.chown(check_dir, *owner)
        obs = await hands.execute(harness_code(task.verifier.code, answer, nonce), timeout=task.verifier.timeout)
    finally:
        await hands.shutdown()
    ms = round((time.perf_counter() - t0) * 1000, 1)
    v = read_verdict(obs.stdout, nonce)
    details: dict[str, Any] = {"duration_ms": ms, "copy_notes": notes[:20]}
    if v is None:
        why = _clip(obs.text(), 1000)
        return Verdict(False, 0.0, f"the verifier did not finish: {why}", "python", details)
    passed = bool(v.get("passed"))
    return Verdict(passed, _score(v.get("score"), passed), _clip(v.get("explanation", "")), "python", details)


# -- rubric verifiers ---------------------------------------------------------------------

GRADER_SYSTEM = (
    "You grade the work of an AI agent against a rubric. Judge only what is shown. Reply with one JSON object "
    'and nothing else: {"passed": true|false, "score": a number from 0 to 1, "explanation": "one or two sentences"}.'
)
JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def listing(workspace: Path) -> str:
    """The workspace's files with their sizes (at most MAX_LISTED_FILES), for the grading model."""
    rows: list[str] = []
    for p in sorted(workspace.rglob("*")):
        if len(rows) >= MAX_LISTED_FILES:
            rows.append("…")
            break
        if p.is_file() and not p.is_symlink():
            rows.append(f"{p.relative_to(workspace)} ({p.stat().st_size} bytes)")
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
