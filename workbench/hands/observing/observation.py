"""What one call produced, as a notebook shows it: the Observation, and what the model reads of it.

`outputs` is the record: nbformat-like, every MIME bundle kept within the call's budget (collect.py,
fold.py). The model reads text and image blocks rendered from them within its own budget of text
and images (render.py), so a stored observation gives the same blocks whenever it is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .render import blocks


@dataclass
class Observation:
    """What one code execution produced: its outputs in order, as a notebook shows them (see fold.py).

    `outputs` is the record (nbformat-like dicts, every MIME bundle kept within the budget);
    `stdout`, `stderr` and `result` are its text by kind, for a quick look; `error` the call's error.
    """

    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the execute result(s), one per line
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None  # {ename, evalue, traceback}
    truncated: list[str] = field(default_factory=list)  # notes on what was cut
    generation: int | None = None
    duration_ms: float | None = None
    notes: list[str] = field(default_factory=list)  # e.g. what was replayed
    # what the model reads of it (content_blocks): characters of text in all, images (None: not bounded); not stored
    text_limit: int | None = None
    max_images: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def displays(self) -> list[dict[str, Any]]:
        """The MIME bundles of the call's displays (not its results), in order."""
        return [o["data"] for o in self.outputs if o.get("output_type") == "display_data" and isinstance(o.get("data"), dict)]

    def to_json(self) -> dict[str, Any]:
        return {
            "outputs": self.outputs,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "result": self.result,
            "error": self.error,
            "truncated": self.truncated,
            "generation": self.generation,
            "duration_ms": self.duration_ms,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Observation:
        """An observation as stored; one stored before `outputs` existed gets them from its fields."""
        fields: dict[str, Any] = {k: d.get(k) for k in cls.__dataclass_fields__ if k in d}
        obs = cls(**fields)
        if "outputs" not in d:
            obs.outputs = [*({"output_type": "stream", "name": n, "text": t} for n, t in
                             (("stdout", obs.stdout), ("stderr", obs.stderr)) if t),
                           *({"output_type": "display_data", "data": b} for b in d.get("displays") or []),
                           *([{"output_type": "execute_result", "data": {"text/plain": obs.result}}] if obs.result else [])]
        return obs

    def all_outputs(self) -> list[dict[str, Any]]:
        """The outputs, with the error last if it is not among them (a death, a timeout, a refusal)."""
        outputs = list(self.outputs)
        if not outputs and (self.stdout or self.stderr):  # a failure that kept the text of what ran
            outputs = [{"output_type": "stream", "name": n, "text": t} for n, t in
                       (("stdout", self.stdout), ("stderr", self.stderr)) if t]
        if self.error and not any(o.get("output_type") == "error" for o in outputs):
            outputs.append({"output_type": "error", **self.error})
        return outputs

    def content_blocks(self) -> list[dict[str, Any]]:
        """tool_result content: text and image blocks in the order of the outputs, within the observation's
        text_limit and max_images (see render.py)."""
        return blocks(self.all_outputs(), self.notes, self.truncated, self.text_limit, self.max_images)

    def text(self) -> str:
        """The observation as plain text (its text blocks; images as a mark)."""
        return "\n".join(b["text"] if b["type"] == "text" else f"[image: {b['source']['media_type']}]"
                         for b in self.content_blocks())


def failure(message: str, ename: str = "HandsError", **kw: Any) -> Observation:
    """An observation that carries only an error message."""
    return Observation(error={"ename": ename, "evalue": message, "traceback": [f"{ename}: {message}"]}, **kw)
