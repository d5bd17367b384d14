"""Turning one execution's Jupyter messages into an Observation, with caps.

Shared by every backend that speaks the Jupyter message protocol (local
kernels over ZMQ, gateway kernels over a websocket), so that they report
output, errors, displays and truncation in exactly the same way.
"""

from __future__ import annotations

from typing import Any

from .base import Observation, OutputCap
from .kernel_cap import DROPPED_MIME


class Collector:
    """Folds the iopub messages of one execute request into an Observation."""

    def __init__(self, limit: int, generation: int):
        self.limit = limit
        self.out, self.err, self.res = OutputCap("stdout", limit), OutputCap("stderr", limit), OutputCap("result", limit)
        self.obs = Observation(generation=generation)

    def feed(self, msg_type: str, c: dict[str, Any]) -> bool:
        """Take one message of this execution; True when the kernel is idle again (done)."""
        if msg_type == "stream":
            (self.out if c.get("name") == "stdout" else self.err).add(c.get("text", ""))
        elif msg_type == "execute_result":
            self.res.add(c.get("data", {}).get("text/plain", ""))
        elif msg_type in ("display_data", "update_display_data"):
            data = c.get("data", {})
            if DROPPED_MIME in data:  # the in-kernel cap tells how much it kept back
                self.out.dropped += int(data[DROPPED_MIME].get("stdout", 0))
                self.err.dropped += int(data[DROPPED_MIME].get("stderr", 0))
            else:
                self.obs.displays.append(cap_bundle(data, self.limit))
        elif msg_type == "error":
            self.obs.error = cap_error(c, self.limit)
        elif msg_type == "status" and c.get("execution_state") == "idle":
            return True
        return False

    def done(self) -> Observation:
        """The observation so far, with truncation notes."""
        obs = self.obs
        obs.stdout, obs.stderr = self.out.value(), self.err.value()
        obs.result = self.res.value() if self.res.parts else None
        obs.truncated = [n for n in (self.out.note(), self.err.note(), self.res.note()) if n]
        return obs


def cap_bundle(data: dict[str, Any], limit: int) -> dict[str, Any]:
    """A display bundle with text parts cut to `limit` (images are kept whole)."""
    out = {}
    for mime, value in data.items():
        if isinstance(value, str) and not mime.startswith("image/") and len(value) > limit:
            value = value[:limit] + f"\n[{mime} truncated at {limit:,} characters]"
        out[mime] = value
    return out


def cap_error(c: dict[str, Any], limit: int) -> dict[str, Any]:
    """An error message's fields, bounded: the last 50 traceback lines, each cut to `limit`."""

    def cut(s: str) -> str:
        return s if len(s) <= limit else s[:limit] + f" [... {len(s) - limit:,} characters cut]"

    return {"ename": c.get("ename"), "evalue": cut(str(c.get("evalue", ""))),
            "traceback": [cut(line) for line in (c.get("traceback") or [])[-50:]]}


def setup_code(limit: int) -> str:
    """The code every new kernel runs first (silently): the in-kernel output cap."""
    from pathlib import Path

    source = Path(__file__).with_name("kernel_cap.py").read_text()
    return source + f"\ninstall({int(limit)})\ndel install\n"


def death_note(how: str) -> str:
    """What the model is told when the kernel died during its call."""
    return (f"the kernel died ({how}) while running this call; its in-memory state "
            "(variables, imports, open files) is gone. The next call runs in a fresh kernel.")


def stuck_note(timeout: float, grace: float) -> str:
    """What the model is told when a call ignored its interrupt and the kernel was replaced."""
    return (f"the call ran past its {timeout:g} s timeout and ignored the interrupt for {grace:g} s, "
            "so its kernel was killed; its in-memory state is gone. The next call runs in a fresh kernel.")


TIMED_OUT = "[timed out after {timeout:g} s: the call was interrupted; the kernel and its state survive]"


async def replay(calls: list[dict[str, Any]], run: Any, emit: Any, generation: int, timeout: float) -> list[str]:
    """Re-run replayable calls in a fresh kernel, stopping at the first failure; notes for the model."""
    if not calls:
        return []
    ran, failed = [], None
    for call in calls:
        obs = await run(call["code"], timeout)
        if not obs.ok:
            failed = call
            break
        ran.append(call)
    await emit("hands_replayed", {"generation": generation, "calls": [c["tool_use_id"] for c in ran],
                                  "ok": failed is None, "failed": failed["tool_use_id"] if failed else None})
    lines = "\n".join(f"- {(c['code'].strip().splitlines() or ['(empty)'])[0][:100]}" for c in ran)
    notes = [f"[the kernel was fresh, so {len(ran)} earlier call(s) marked replayable were re-run first:\n{lines}]"]
    if failed:
        notes.append(f"[replay stopped: call {failed['tool_use_id']} failed when re-run; later ones were not re-run]")
    return notes
