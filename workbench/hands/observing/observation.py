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
    # what the model reads of it (content_blocks): characters of text in all, images (None: not bounded)
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
        """The observation as stored: its outputs once, and what the model's reading of them needs (its notes and
        its budget), so that `from_json(...).content_blocks()` gives the same blocks. stdout, stderr and result
        are read from the outputs again."""
        return {
            "outputs": self.outputs or _streams(self.stdout, self.stderr),
            "error": self.error,
            "truncated": self.truncated,
            "generation": self.generation,
            "duration_ms": self.duration_ms,
            "notes": self.notes,
            "text_limit": self.text_limit,
            "max_images": self.max_images,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Observation:
        """An observation as stored, in any of its shapes: with `outputs` alone (stored once), with `stdout`,
        `stderr` and `result` beside them (before), or with those and `displays` but no outputs (earlier)."""
        fields: dict[str, Any] = {k: d.get(k) for k in cls.__dataclass_fields__ if k in d}
        obs = cls(**fields)
        if "outputs" not in d:
            obs.outputs = [*_streams(obs.stdout, obs.stderr),
                           *({"output_type": "display_data", "data": b} for b in d.get("displays") or []),
                           *([{"output_type": "execute_result", "data": {"text/plain": obs.result}}] if obs.result else [])]
        elif not any(k in d for k in ("stdout", "stderr", "result")):
            obs.stdout, obs.stderr, obs.result = text_by_kind(obs.outputs)
        return obs

    def all_outputs(self) -> list[dict[str, Any]]:
        """The outputs, with the error last if it is not among them (a death, a timeout, a refusal)."""
        outputs = list(self.outputs) or _streams(self.stdout, self.stderr)  # a failure may keep only the text
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


def text_by_kind(outputs: list[dict[str, Any]]) -> tuple[str, str, str | None]:
    """(stdout, stderr, result) of the outputs: the streams' text by name, and the results' text/plain, one per line."""
    streams = [o for o in outputs if o.get("output_type") == "stream"]
    stdout = "".join(o["text"] for o in streams if o.get("name") == "stdout")
    stderr = "".join(o["text"] for o in streams if o.get("name") == "stderr")
    results = [o["data"].get("text/plain") for o in outputs if o.get("output_type") == "execute_result"]
    return stdout, stderr, "\n".join(r for r in results if isinstance(r, str)) if results else None


def result_content(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks a `tool_result` gave the model: stored as they were (a tool that is not the hands', a
    result stored before observations were stored once), or rendered again from its observation."""
    content = payload.get("content")
    if isinstance(content, list):
        return content
    observation = payload.get("observation")
    if isinstance(observation, dict):
        return Observation.from_json(observation).content_blocks()
    return []


def _streams(stdout: str, stderr: str) -> list[dict[str, Any]]:
    return [{"output_type": "stream", "name": n, "text": t} for n, t in (("stdout", stdout), ("stderr", stderr)) if t]
