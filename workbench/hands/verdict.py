"""A verdict from a check run where the agent cannot reach: fresh hands over a frozen copy of its workspace.

`python_verdict` is the one python verifier of evals and of delegate checks. It runs in fresh hands of
its own (a new kernel from the host's hands factory, never the agent's) with a workspace of its own,
into which the agent's workspace is *copied* while every process of the agent's kernel is stopped
(`Hands.frozen`), by `hands.files.copy_tree` (by descriptor, never through a link). The check's code
comes from the host (a task set loaded before the attempt began, or the parent's call) and goes to the
kernel as the cell's text (no file the agent could rewrite); its verdict comes back on a line marked with
a random nonce that the agent never sees: a file the agent wrote that claims a verdict is just a file.
The kernel starts in a directory holding only the copy's folder; before the check runs, the copy is
taken off `sys.path`, so a `pandas.py` the agent left there is not what `import pandas` finds.

Where the kernels run on a gateway, the agent's files are on the gateway's machine and neither they nor
its kernel can be reached from here: the check then runs in fresh hands on the gateway, in an empty
directory made for it there, over the answer alone, and `copy_notes` says so (a check that reads the
agent's files fails there: such tasks need hands on this machine).
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..strictnum import parse_constant
from .base import Hands
from .files import NoWorkspace, copy_tree, list_files

MAX_EXPLANATION_CHARS = 4000
MAX_COPY_BYTES = 512 * 1024 * 1024  # what a workspace copy may hold; the rest is left out, with a note
MAX_COPY_ENTRIES = 20_000  # files, directories and the rest a copy walks; the rest is left out, with a note


@dataclass
class Verdict:
    """A verifier's result: passed, a score in [0, 1] and why; `details["error"]` when no verdict could be reached
    (the check could not run, its hands died, it timed out: not the checked work's failure, evals count it apart)."""

    passed: bool
    score: float
    explanation: str
    kind: str = "python"
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def clip(text: Any, limit: int = MAX_EXPLANATION_CHARS) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"


def score_of(value: Any, passed: bool) -> float:
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
except KeyboardInterrupt:
    _wb_v["explanation"] = _wb_v["error"] = "the check ran past its timeout and was interrupted"
except BaseException as _wb_e:
    _wb_v["explanation"] = f"the check raised {{type(_wb_e).__name__}}: {{_wb_e}}"
if not isinstance(_wb_v["score"], (int, float)) or isinstance(_wb_v["score"], bool) or not abs(_wb_v["score"]) <= 1e308:
    _wb_v["score"] = None
print({nonce} + _wb_json.dumps(_wb_v, default=str))
"""


MAX_LISTED_FILES = 200
MAX_LISTED_ENTRIES = 2_000  # entries walked to list the files for a grading model


def listing(workspace: Path | None) -> str:
    """A workspace's files with their sizes (at most MAX_LISTED_FILES; links never followed), for a grading model."""
    if workspace is None or not workspace.is_dir():
        return "(no files)"
    entries, cut = list_files(workspace, MAX_LISTED_ENTRIES)
    files = [f for f in entries if f["type"] == "file"]
    rows = [f"{f['path']} ({f['bytes']} bytes)" for f in files[:MAX_LISTED_FILES]]
    if cut or len(files) > MAX_LISTED_FILES:
        rows.append("…")
    return "\n".join(rows) or "(no files)"


# Around the cell on a gateway: an empty `workspace` folder in a directory of its own, removed after
REMOTE_BEFORE = """\
import os as _wb_o, shutil as _wb_sh, tempfile as _wb_t
_wb_tmp = _wb_t.mkdtemp(prefix="wbcheck-")
_wb_o.mkdir(_wb_o.path.join(_wb_tmp, "workspace"))
_wb_o.chdir(_wb_tmp)
"""
REMOTE_AFTER = """
_wb_o.chdir(_wb_t.gettempdir())
_wb_sh.rmtree(_wb_tmp, True)
"""
ANSWER_ONLY = ("the agent's files are on the gateway's machine, out of reach from here: the check ran over the "
               "answer alone, in an empty directory")


def harness_code(check: str, answer: str, nonce: str, *, remote: bool = False) -> str:
    """The verifier's cell: the check wrapped so that its verdict comes back on a line marked with `nonce`
    (`remote`: in an empty directory of its own, made for it on the gateway's machine and removed after)."""
    cell = HARNESS.format(answer=json.dumps(json.dumps(answer)), code=json.dumps(json.dumps(check)), nonce=json.dumps(nonce))
    return REMOTE_BEFORE + cell + REMOTE_AFTER if remote else cell


def read_verdict(out: str, nonce: str) -> dict[str, Any] | None:
    """The verdict the harness printed (the last line marked with nonce), or None."""
    for line in reversed(out.splitlines()):
        if line.startswith(nonce):
            try:
                v = json.loads(line[len(nonce):], parse_constant=parse_constant)
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

    def verdict(passed: bool, score: float, explanation: str, error: Any = None) -> Verdict:
        details["duration_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        details["copy_notes"] = details["copy_notes"][:20]
        if error:
            details["error"] = clip(error, 1000)
        return Verdict(passed, score, explanation, "python", details)

    def unchecked(why: str) -> Verdict:
        return verdict(False, 0.0, why, why)

    if hands_factory is None:
        return unchecked("not checked: this host runs no code")
    source = await agent.workspace()
    # one call, then closed: a spare kernel beside it would boot for nothing (as many kernels again as checks)
    config = {"hands": {"spare": False, **({"timeout": float(timeout)} if timeout else {})}}
    hands = hands_factory(label, config, None, None)  # no log of their own: the verdict is the record
    try:
        try:
            root: Path | None = await hands.workspace(create=True)
        except NoWorkspace as e:
            if hands.status()["state"] == "refused" or source is not None:  # this host's hands refuse to run code
                return unchecked(f"not checked: {e}")
            root = None  # the kernels run on a gateway, the agent's as well as this one
        if root is None:
            details["copy_notes"] = [ANSWER_ONLY]
        elif source is None or not source.is_dir():
            return unchecked("not checked: there is no workspace to check on this machine (no code ran, "
                             "or its workspace did not survive a restart)")
        else:
            async with agent.frozen() as notes:
                # into a folder of the kernel's directory: `python -m` puts that directory on sys.path at start,
                # so an `ipykernel_launcher.py` or `sitecustomize.py` the agent wrote must not be in it
                details["copy_notes"] = notes + await asyncio.to_thread(
                    copy_tree, source, root / "workspace", limit_bytes=limit_bytes, max_entries=max_entries,
                    owner=hands.workspace_owner())
        nonce = "WBVERDICT-" + secrets.token_hex(16)
        obs = await hands.execute(harness_code(code, answer, nonce, remote=root is None), timeout=timeout)
    finally:
        await hands.shutdown()
    v = read_verdict(obs.stdout, nonce)
    if v is None:
        return unchecked(f"the verifier did not finish: {clip(obs.text(), 1000)}")
    passed = bool(v.get("passed")) and not v.get("error")
    return verdict(passed, score_of(v.get("score"), passed), clip(v.get("explanation", "")), v.get("error"))
