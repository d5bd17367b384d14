"""Errors, not failures: what cut an attempt off that the model did not cause.

An attempt is graded on what its model did. When something outside the model cut a turn off, a
grade would measure that instead, so the attempt ends with outcome `error` (and the run tries it
again, docs/evals.md "Errors are not failures"). Read from the turn's events:

    resumed        the process running the turn died (a server or CLI killed) and the turn was finished
                   by the next one: its cut-off call was answered "interrupted; state unknown"
    interrupted    the run was interrupted (Ctrl-C, SIGTERM, the API) or the host shut down mid-turn
    turn_failed    the harness failed
    model_error    the model call failed after the brain's retries (an overload, a 5xx, a refused request)
    hands_died     the kernel was killed from outside (`killed_from_outside`); a death of its own
                   (exit(), os._exit, a crash, its memory limit) is the model's doing: graded as usual
    tool_result    a call whose kernel could not start (`KernelStartError`: a gateway that did not
                   connect it in time, a kernel that died booting, a sandbox that would not start)

A verdict that could not be reached (its hands died, it timed out, its harness or grading model
failed) carries `details.error` (workbench/hands/verdict.py, verify.py): `verdict_error`.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

# deaths by these signals come from outside the kernel (a person, a supervisor, a host that went away): code that
# sends them to its own kernel cannot be told apart from that, and is counted as killed from outside too
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP})
WRAPPED = 128  # a wrapper (bubblewrap, a launcher) exits 128 + N when the kernel inside it died of signal N


def _signal(number: Any) -> signal.Signals | None:
    try:
        return signal.Signals(int(number))
    except (TypeError, ValueError):
        return None


def killed_from_outside(died: dict[str, Any]) -> bool:
    """Whether a `hands_died` payload is a death the kernel's own code did not cause."""
    how = str(died.get("how") or "")
    if "out of memory" in how:  # the cgroup's OOM killer sends SIGKILL, for memory the code asked for
        return False
    code, sig = died.get("exit_code"), _signal(died.get("signal"))
    if sig is not None:
        return sig in OUTSIDE_SIGNALS
    if isinstance(code, int) and not isinstance(code, bool):
        return code > WRAPPED and _signal(code - WRAPPED) in OUTSIDE_SIGNALS and "i.e. signal" in how
    return "exit()" not in how  # no status: a gateway's kernel that went away, or one the hands stopped


def _turn(events: Sequence[Any]) -> Sequence[Any]:
    """The events of the latest turn: from its user message on."""
    start = max((i for i, e in enumerate(events) if e.type == "user_message"), default=0)
    return events[start:]


def cut_off(events: Sequence[Any]) -> str | None:
    """Why the attempt's latest turn was cut off by something outside the model (the first cause), or None."""
    for e in _turn(events):
        p = e.payload
        if e.type == "resumed":
            return "the process running the turn died mid-turn (a server or CLI killed); its cut-off call was not re-run"
        if e.type == "interrupted":
            return f"the turn was interrupted (by {p.get('by') or 'someone'})"
        if e.type == "turn_failed":
            return f"the harness failed: {str(p.get('error'))[:300]}"
        if e.type == "model_error":
            status = f" ({p['status']})" if p.get("status") is not None else ""
            return f"the model call failed{status} after {p.get('attempts', 1)} attempt(s): {str(p.get('error'))[:300]}"
        if e.type == "hands_died" and killed_from_outside(p):
            return f"the kernel was killed from outside ({p.get('how')})"
        if e.type == "tool_result" and (why := start_failure(p)) is not None:
            return f"the agent's kernel could not start: {why[:300]}"
    return None


def start_failure(result: dict[str, Any]) -> str | None:
    """What a `tool_result` says when its call never ran because its kernel could not start, else None. Such a
    call has no kernel generation: every call a kernel ran has one, so code that raises an exception of that name
    (to turn a failure into an error, left out of the pass rate) is graded as usual."""
    observation = result.get("observation")
    if not isinstance(observation, dict) or observation.get("generation") is not None:
        return None
    error = observation.get("error")
    if isinstance(error, dict) and error.get("ename") == "KernelStartError":
        return str(error.get("evalue") or "")
    return None


def verdict_error(verdict: dict[str, Any]) -> str | None:
    """Why a verifier could not reach a verdict (its `details.error`), or None when it graded."""
    error = (verdict.get("details") or {}).get("error")
    return f"the verifier could not run: {str(error)[:300]}" if error else None
