"""Turning one execution's Jupyter messages into an Observation, with caps, whatever the kernel sends.

Shared by every backend that speaks the Jupyter message protocol (local
kernels over ZMQ, gateway kernels over a websocket), so that they report
output, errors, displays and truncation in exactly the same way.

A message's content comes from kernel code and is checked here, field by field: a field of the
wrong type, a display bundle that is not an object of strings (or JSON, for JSON types), an
image that is not one, a lone surrogate, a number the log cannot store: each is dropped (or
repaired, for surrogates) with a note the model reads, and never raises. What is kept stays
within the session's budget (`Budget`): `output_limit` characters per stream and per text part
of a display, `max_displays` displays, images of at most `max_image_bytes` (bigger ones are
downscaled), and `max_observation_bytes` for everything together, as the log would store it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from . import clean, images
from .base import Observation, OutputCap
from .kernel_cap import DROPPED_MIME

MAX_NOTES = 12  # notes about dropped or repaired output per call; then one that says there were more
MAX_MIME_CHARS = 255  # the longest MIME type name kept


@dataclass(frozen=True)
class Budget:
    """What one call's observation may hold (from the session's HandsConfig)."""

    output_limit: int = 20_000  # characters per stream, result and text part of a display
    max_displays: int = 20
    max_bytes: int = 4 * 1024 * 1024  # the whole observation, as compact UTF-8 JSON
    max_image_bytes: int = 1024 * 1024  # one image, decoded


class Collector:
    """Folds the iopub messages of one execute request into an Observation."""

    def __init__(self, budget: Budget, generation: int):
        self.budget = b = budget
        self.limit = b.output_limit
        self.out, self.err, self.res = OutputCap("stdout", b.output_limit), OutputCap("stderr", b.output_limit), \
            OutputCap("result", b.output_limit)
        self.obs = Observation(generation=generation)
        self.display_bytes = 0
        self.over_count = 0  # displays dropped: more than max_displays
        self.over_bytes = 0  # displays dropped: over max_observation_bytes
        self.notes: list[str] = []
        self._more_notes = 0

    def note(self, text: str) -> None:
        """A note for the model about output that was dropped, cut or repaired (a few per call, then a count)."""
        if text in self.notes:
            return
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self._more_notes += 1

    async def feed(self, msg_type: str, c: dict[str, Any]) -> bool:
        """Take one message of this execution; True when the kernel is idle again (done)."""
        if msg_type == "stream":
            text = c.get("text")
            if isinstance(text, str):
                (self.out if c.get("name") == "stdout" else self.err).add(text)
            else:
                self.note("[a stream message without text from the kernel was dropped]")
        elif msg_type == "execute_result":
            data = c.get("data")
            plain = data.get("text/plain", "") if isinstance(data, dict) else None
            if isinstance(plain, str):
                self.res.add(plain)
            else:
                self.note("[a malformed execute_result from the kernel was dropped: its data is not an object with "
                          "text/plain as a string]")
        elif msg_type in ("display_data", "update_display_data"):
            await self._display(c.get("data"))
        elif msg_type == "error":
            self.obs.error = self._error(c)
        elif msg_type == "status" and c.get("execution_state") == "idle":
            return True
        return False

    async def _display(self, data: Any) -> None:
        if not isinstance(data, dict):
            self.note("[a display was dropped: its data is not a MIME bundle (an object of MIME types)]")
            return
        if DROPPED_MIME in data:  # the in-kernel cap tells how much it kept back
            self._kernel_dropped(data[DROPPED_MIME])
            return
        if len(self.obs.displays) >= self.budget.max_displays:
            self.over_count += 1
            return
        bundle = await self._bundle(data)
        if not bundle:
            return
        size = clean.size(bundle)
        if self._text_bytes() + self.display_bytes + size > self.budget.max_bytes:
            self.over_bytes += 1
            return
        self.obs.displays.append(bundle)
        self.display_bytes += size

    def _kernel_dropped(self, counts: Any) -> None:
        ok = isinstance(counts, dict)
        for name, cap in (("stdout", self.out), ("stderr", self.err)):
            n = counts.get(name, 0) if ok else None
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**53:
                cap.dropped += n
            else:
                ok = False
        if not ok:
            self.note("[a malformed note of dropped output from the kernel was ignored]")

    async def _bundle(self, data: dict[str, Any]) -> dict[str, Any]:
        """A display bundle as kept: text cut to output_limit, JSON checked, images fitted; notes for the rest."""
        out: dict[str, Any] = {}
        for mime, value in data.items():
            if not isinstance(mime, str) or len(mime) > MAX_MIME_CHARS:
                self.note("[a part of a display with a malformed MIME type was dropped]")
                continue
            mime = clean.text(mime)
            if mime.startswith("image/") and not mime.startswith("image/svg"):
                if not isinstance(value, str):
                    self.note(f"[an {mime} display was dropped: its data is not a string]")
                    continue
                fitted = await asyncio.to_thread(images.fit, mime, value, self.budget.max_image_bytes)
                if fitted.note:
                    self.note(fitted.note)
                if fitted.data is not None:
                    out[mime] = fitted.data
            elif isinstance(value, str):
                out[mime] = clean.cut(clean.text(value[: self.limit + 1]), self.limit, mime)
            elif mime == "application/json" or mime.endswith("+json"):
                try:
                    value = clean.json_value(value)
                except clean.NotJSON as e:
                    self.note(f"[the {mime} part of a display was dropped: it holds {e}]")
                    continue
                if (n := clean.size(value)) > self.limit:
                    self.note(f"[the {mime} part of a display was dropped: {n:,} bytes of JSON, over output_limit "
                              f"({self.limit:,})]")
                    continue
                out[mime] = value
            else:
                self.note(f"[the {mime} part of a display was dropped: a {type(value).__name__}, not text]")
        return out

    def _error(self, c: dict[str, Any]) -> dict[str, Any]:
        """An error message's fields, checked and bounded: the last 50 traceback lines, each cut to `limit`."""
        ename, evalue, tb = c.get("ename"), c.get("evalue"), c.get("traceback")
        if not (isinstance(ename, str) and isinstance(evalue, str) and isinstance(tb, list)
                and all(isinstance(line, str) for line in tb)):
            self.note("[the kernel's error message was malformed: what could be read of it is shown]")
        lines = [line for line in tb if isinstance(line, str)][-50:] if isinstance(tb, list) else []
        return {"ename": clean.text(ename[:200]) if isinstance(ename, str) else "Error",
                "evalue": self._cut(evalue) if isinstance(evalue, str) else "",
                "traceback": [self._cut(line) for line in lines]}

    def _cut(self, s: str) -> str:
        s = clean.text(s[: self.limit + 1])
        return s if len(s) <= self.limit else s[: self.limit] + " [... cut]"

    def _text_bytes(self) -> int:
        """A quick lower bound of the text's bytes so far (exact sizes are taken in done())."""
        return self.out.kept + self.err.kept + self.res.kept

    def done(self) -> Observation:
        """The observation so far, within max_observation_bytes, with its notes."""
        obs = self.obs
        obs.stdout, obs.stderr = self.out.value(), self.err.value()
        obs.result = self.res.value() if self.res.parts else None
        notes = [n for n in (self.out.note(), self.err.note(), self.res.note()) if n]
        self._fit(obs)
        b = self.budget
        if self.over_count:
            notes.append(f"[{self.over_count:,} more display(s) were dropped: a call keeps at most {b.max_displays} "
                         "(max_displays); save figures to files, or combine them]")
        if self.over_bytes:
            notes.append(f"[{self.over_bytes:,} display(s) were dropped: with them the output would have been over "
                         f"{b.max_bytes:,} bytes (max_observation_bytes)]")
        notes += self.notes
        if self._more_notes:
            notes.append(f"[and {self._more_notes:,} more notes like these]")
        obs.truncated = notes
        return obs

    def _fit(self, obs: Observation) -> None:
        """Displays from the last, then text, until the whole observation is within max_observation_bytes."""
        def total() -> int:
            return sum(clean.size(v) for v in (obs.stdout, obs.stderr, obs.result, obs.error)) + self.display_bytes

        over = total() - self.budget.max_bytes
        while over > 0 and obs.displays:
            self.display_bytes -= clean.size(obs.displays.pop())
            self.over_bytes += 1
            over = total() - self.budget.max_bytes
        for _ in range(4):  # text alone over the budget (a large output_limit): cut the longest part
            if over <= 0:
                return
            name = max(("stdout", "stderr", "result"), key=lambda k: len(getattr(obs, k) or ""))
            value = getattr(obs, name) or ""
            keep = max(0, len(value) - over - 200)
            setattr(obs, name, value[:keep] + f"\n[{name} cut to {keep:,} characters: over max_observation_bytes]")
            over = total() - self.budget.max_bytes
        if over > 0 and obs.error:
            obs.error["traceback"] = obs.error["traceback"][-1:]


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
