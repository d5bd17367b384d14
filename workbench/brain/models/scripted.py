"""A scripted model: deterministic, offline, shipped in the package.

It answers Messages API requests from a script instead of a network call, so
`workbench demo`, the notebooks and the tests run with no key and no
internet. A script is a function of the request; the same request always
gets the same answer, so a resumed session sees the same model it left.

Scripts by name (`--model scripted:NAME`):

- `default`: runs the ```python blocks of a message with the `python` tool
  and reports the output; otherwise says what it is and how to get a real model.
- `demo`: a short data analysis in three steps (the `workbench demo` script).
- `crash`: sets a variable, kills its own kernel, then notices the state is gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import orjson

from ...errors import UnknownModel
from .base import message_events

SIGNING_KEY = b"workbench-scripted-model"
TOKENS_PER_MESSAGE = 200  # what the usage estimate counts for each message before the latest

Script = Callable[[dict[str, Any]], "Reply"]


@dataclass
class Reply:
    """One model response, written by a script."""

    text: str | None = None
    thinking: str | None = None  # "" gives an empty thinking block with a signature
    code: list[str] = field(default_factory=list)  # each becomes a `python` tool call
    tool_calls: list[tuple[str, dict]] = field(default_factory=list)  # (name, input) for other tools
    stop_reason: str | None = None  # default: tool_use when there are calls, else end_turn
    redacted: bool = False  # add a redacted_thinking block
    stop_details: dict | None = None

    def message(self, request: dict[str, Any], key: bytes = SIGNING_KEY,
                digest: Callable[[list[dict[str, Any]]], str] | None = None) -> dict[str, Any]:
        """The complete assistant message, with deterministic ids (from `digest` of the messages: by default
        of all of them) and signed thinking."""
        messages = request.get("messages", [])
        digest_ = (digest or history_digest)(messages)
        content: list[dict[str, Any]] = []
        if self.redacted:
            content.append({"type": "redacted_thinking", "data": "redacted-" + digest_[:32]})
        if self.thinking is not None:
            content.append({"type": "thinking", "thinking": self.thinking, "signature": sign(self.thinking, key)})
        if self.text:
            content.append({"type": "text", "text": self.text})
        calls = [("python", {"code": c}) for c in self.code] + list(self.tool_calls)
        for i, (name, inp) in enumerate(calls):
            content.append({"type": "tool_use", "id": f"toolu_{digest_[:20]}{i:02d}", "name": name, "input": inp})
        stop = self.stop_reason or ("tool_use" if calls else "end_turn")
        out_tokens = sum(len(json.dumps(b)) // 4 for b in content) + 1
        # an estimate whose cost does not grow with the session: the latest message as it is, the others at a flat rate
        in_tokens = (len(orjson.dumps(messages[-1])) // 4 if messages else 0) + TOKENS_PER_MESSAGE * max(len(messages) - 1, 0) \
            + len(str(request.get("system", ""))) // 4
        return {
            "id": f"msg_{digest_[:24]}",
            "type": "message",
            "role": "assistant",
            "model": request.get("model", "scripted"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            **({"stop_details": self.stop_details} if self.stop_details else {}),
            "usage": {"input_tokens": in_tokens, "output_tokens": out_tokens},
        }


def history_digest(messages: list[dict[str, Any]]) -> str:
    """A digest of every message of a request (what the fake Messages API's recorded answers are named by)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


def step_digest(messages: list[dict[str, Any]]) -> str:
    """A digest of a request that differs between the steps of a session, at a cost that does not grow with it:
    the number of messages (it grows with every step) and the last two (the step's own input)."""
    h = hashlib.sha256(str(len(messages)).encode())
    for m in messages[-2:]:
        h.update(orjson.dumps(m, option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()


def sign(thinking: str, key: bytes = SIGNING_KEY) -> str:
    """An opaque signature over a thinking block's text."""
    return "sig_" + hmac.new(key, thinking.encode(), hashlib.sha256).hexdigest()


# -- reading the request ------------------------------------------------------


def _is_user_text(msg: dict[str, Any]) -> bool:
    if msg["role"] != "user":
        return False
    c = msg["content"]
    return isinstance(c, str) or any(b.get("type") == "text" for b in c)


def user_text(msg: dict[str, Any]) -> str:
    c = msg["content"]
    return c if isinstance(c, str) else "\n".join(b["text"] for b in c if b.get("type") == "text")


def position(request: dict[str, Any]) -> tuple[int, int, str]:
    """(turn index, step within the turn, the turn's user text) of a request."""
    msgs = request.get("messages", [])
    starts = [i for i, m in enumerate(msgs) if _is_user_text(m)]
    if not starts:
        return 0, 0, ""
    last = starts[-1]
    steps = sum(1 for m in msgs[last:] if m["role"] == "assistant")
    return len(starts) - 1, steps, user_text(msgs[last])


def last_tool_output(request: dict[str, Any]) -> str:
    """The text of the most recent tool results."""
    msgs = request.get("messages", [])
    if not msgs or msgs[-1]["role"] != "user" or isinstance(msgs[-1]["content"], str):
        return ""
    texts = []
    for b in msgs[-1]["content"]:
        if b.get("type") == "tool_result":
            c = b.get("content")
            if isinstance(c, str):
                texts.append(c)
            else:
                texts += [x["text"] for x in c or [] if x.get("type") == "text"]
    return "\n".join(texts)


def fenced(text: str) -> str:
    """Raw output as a Markdown code block, so it keeps its layout (a DataFrame's columns, a traceback's lines):
    fenced by more backticks than any run of them in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}"


# -- built-in scripts ---------------------------------------------------------

CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def default_script(request: dict[str, Any]) -> Reply:
    """Run the ```python blocks of the message; otherwise explain what this model is."""
    _, step, text = position(request)
    blocks = [b.strip() for b in CODE_BLOCK.findall(text)]
    if blocks and step == 0:
        return Reply(thinking="", text="I'll run that in my kernel.", code=blocks)
    if blocks:
        out = last_tool_output(request)
        return Reply(text=f"Here is what it printed:\n\n{fenced(out)}")
    return Reply(
        thinking="",
        text=(
            "I am the workbench's scripted model: offline and deterministic. Send me a "
            "```python``` block and I will run it in my hands (a separate kernel). For a real "
            "model, set ANTHROPIC_API_KEY and choose e.g. --model claude-opus-5-5.\n\n"
            f"You said: {text.strip()[:500]}"
        ),
    )


DEMO_STEPS = (
    (
        "The user wants a small analysis. Plan: make a reproducible dataset, summarise it, "
        "then report the warmest week.",
        "I'll start by generating a reproducible dataset: 28 days of noon temperatures.",
        "import random, statistics\n"
        "rng = random.Random(42)\n"
        "temps = [round(12 + 6 * rng.random() + day * 0.25, 1) for day in range(28)]\n"
        "print(len(temps), 'days; first week:', temps[:7])",
    ),
    (
        "",
        "Now the summary statistics and the warmest week.",
        "weeks = [temps[i:i + 7] for i in range(0, 28, 7)]\n"
        "means = [round(statistics.mean(w), 2) for w in weeks]\n"
        "print('mean', round(statistics.mean(temps), 2), 'stdev', round(statistics.stdev(temps), 2))\n"
        "print('weekly means', means)\n"
        "print('warmest week', means.index(max(means)) + 1)",
    ),
)


def demo_script(request: dict[str, Any]) -> Reply:
    """A three-step data analysis in a real kernel."""
    _, step, _ = position(request)
    if step < len(DEMO_STEPS):
        thinking, text, code = DEMO_STEPS[step]
        return Reply(thinking=thinking, text=text, code=[code])
    out = last_tool_output(request)
    mean = re.search(r"mean ([\d.]+) stdev ([\d.]+)", out)
    week = re.search(r"warmest week (\d)", out)
    if not (mean and week):
        return Reply(text=f"The analysis did not produce what I expected; the output was:\n\n{fenced(out)}")
    return Reply(
        text=(
            f"Done. Over 28 days the mean noon temperature was {mean.group(1)} °C "
            f"(standard deviation {mean.group(2)} °C), and week {week.group(1)} was the warmest: "
            "the trend is upward, about a quarter of a degree a day."
        )
    )


def crash_script(request: dict[str, Any]) -> Reply:
    """Set state, kill the kernel, and notice that the state is gone."""
    _, step, _ = position(request)
    if step == 0:
        return Reply(thinking="", text="First I'll keep a value in the kernel.", code=["answer = 41 + 1\nprint('answer =', answer)"])
    if step == 1:
        # a moment before the kill: a kernel killed at once can die before it says the call started, and the
        # hands then say the code "may not have run"; the demo shows a death while a call runs, every time
        return Reply(text="Now I'll crash my own kernel on purpose.",
                     code=["import os, time\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)"])
    if step == 2:
        return Reply(text="The kernel died. Is my value still there?", code=["print(answer)"])
    out = last_tool_output(request)
    gone = "NameError" in out
    return Reply(
        text=(
            "As expected, the kernel was replaced: `answer` is gone (NameError), but this "
            "conversation went on because it lives in the session log, not in the kernel."
            if gone
            else f"Unexpected: the value survived.\n\n{fenced(out)}"
        )
    )


BUILTIN_SCRIPTS: Mapping[str, Script] = MappingProxyType(
    {"default": default_script, "demo": demo_script, "crash": crash_script}
)


def steps_script(steps: list[Reply | Callable[[dict], Reply]]) -> Script:
    """A script that answers the n-th model call of a session with steps[n]."""

    def script(request: dict[str, Any]) -> Reply:
        n = sum(1 for m in request.get("messages", []) if m["role"] == "assistant")
        if n >= len(steps):
            return Reply(text="(the script has no more steps)")
        step = steps[n]
        return step(request) if callable(step) else step

    return script


class ScriptedModel:
    """A Model whose answers come from a script, streamed like the real API.

    `script` is a function of the request, a list of steps, or the name of one of
    `scripts` (the built-in ones unless a catalog passes more, e.g. a plugin's).
    """

    def __init__(self, script: str | Script | list = "default", *, delay: float = 0.0, name: str | None = None,
                 scripts: Mapping[str, Script] = BUILTIN_SCRIPTS):
        if isinstance(script, str):
            if script not in scripts:
                raise UnknownModel(f"no scripted model script {script!r}; choose one of {', '.join(scripts)}")
            self.name = name or ("scripted" if script == "default" else f"scripted:{script}")
            script = scripts[script]
        else:
            self.name = name or "scripted"
            if isinstance(script, list):
                script = steps_script(script)
        self.script = script
        self.delay = delay

    async def stream(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        message = self.script(request).message(request, digest=step_digest)  # the harness's benchmarks run it
        for ev in message_events(message):
            if self.delay:
                await asyncio.sleep(self.delay)
            yield ev
