"""What a `delegate` call asks for, checked: every bad value is a tool error the model can act on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..plugins.hands import FileRefused, check_path

MAX_PROMPT = 100_000  # characters of one child's task
MAX_TITLE = 200


class BadInput(ValueError):
    """The call's input is not what the tool takes; the message says what to change."""


@dataclass(frozen=True)
class Check:
    """How a child's work is checked once it has answered: Python run in fresh hands on a copy of its workspace
    (`code`), or a model grading its answer and files against a rubric (`rubric`, by `model`: empty, the child's)."""

    code: str | None = None
    rubric: str | None = None
    model: str = ""

    @property
    def kind(self) -> str:
        return "python" if self.code is not None else "rubric"


@dataclass(frozen=True)
class ChildSpec:
    """One child: its task, model, tools, files and limits (all checked)."""

    prompt: str
    model: str
    title: str
    tools: tuple[str, ...] = ("python",)
    files: tuple[str, ...] = ()
    max_turns: int = 20
    max_tokens: int = 200_000
    timeout: float = 600.0
    check: Check | None = None  # run after each of its turns, as an eval verifier is
    rounds: int = 1  # its turns: while its check fails and rounds are left, the verdict is its next message


    def limits(self) -> dict[str, Any]:
        return {"max_turns": self.max_turns, "max_tokens": self.max_tokens, "timeout": self.timeout}


def _number(task: dict[str, Any], key: str, default: float, cap: float, whole: bool, where: str) -> Any:
    value = task.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{where}: {key} must be a positive {'whole ' if whole else ''}number, at most {cap:g}; got {str(value)[:40]}")
    if whole and value != int(value):
        raise BadInput(f"{where}: {key} must be a whole number; got {value:g}")
    if value > cap:
        raise BadInput(f"{where}: {key} may be at most {cap:g} here; got {value:g}")
    return int(value) if whole else float(value)


def parse(inp: Any, *, parent_model: str, settings: Any, known_tools: set[str]) -> list[ChildSpec]:
    """The children a call asks for; BadInput with a one-line reason otherwise."""
    if not isinstance(inp, dict):
        raise BadInput('delegate takes {"tasks": [{"prompt": "..."}, ...]}')
    tasks = inp.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise BadInput('delegate needs "tasks": a non-empty list of {"prompt": "..."} objects, one per child')
    if len(tasks) > settings.max_children:
        raise BadInput(f"one delegate call may start at most {settings.max_children} children; this one asks for {len(tasks)}")
    unknown = set(inp) - {"tasks"}
    if unknown:
        raise BadInput(f"unknown fields {', '.join(sorted(map(str, unknown)))[:200]}; delegate takes only \"tasks\"")
    specs = []
    for i, task in enumerate(tasks):
        where = f"task {i + 1}"
        if not isinstance(task, dict):
            raise BadInput(f'{where} must be an object like {{"prompt": "..."}}')
        extra = set(task) - {"prompt", "title", "model", "tools", "files", "max_turns", "max_tokens", "timeout", "check",
                             "rounds"}
        if extra:
            raise BadInput(f"{where}: unknown fields {', '.join(sorted(map(str, extra)))[:200]}")
        prompt = task.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadInput(f"{where} needs a prompt: the child's task, as text")
        if len(prompt) > MAX_PROMPT:
            raise BadInput(f"{where}: the prompt is {len(prompt)} characters; at most {MAX_PROMPT} (pass data as files)")
        model = task.get("model", parent_model)
        if not isinstance(model, str) or not model.strip() or len(model) > 200:
            raise BadInput(f"{where}: model must be a model name such as {parent_model!r}")
        title = task.get("title") or prompt.strip().splitlines()[0]
        if not isinstance(title, str):
            raise BadInput(f"{where}: title must be text")
        tools = task.get("tools", ["python"])
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools) or len(tools) > 32:
            raise BadInput(f"{where}: tools must be a list of tool names, e.g. [\"python\"]")
        missing = [t for t in tools if t not in known_tools]
        if missing:
            named = ", ".join(repr(t[:40]) for t in missing[:5])
            raise BadInput(f"{where}: unknown tools {named}; known: {', '.join(sorted(known_tools))}")
        files = task.get("files", [])
        if not isinstance(files, list) or len(files) > settings.max_files:
            raise BadInput(f"{where}: files must be a list of at most {settings.max_files} relative paths in your workspace")
        try:
            paths = tuple(dict.fromkeys(check_path(f) for f in files))
        except FileRefused as e:
            raise BadInput(f"{where}: {e}") from None
        check = _check(task.get("check"), where)
        rounds = _number(task, "rounds", 1, settings.max_rounds, True, where)
        if rounds > 1 and check is None:
            raise BadInput(f"{where}: rounds needs a check: the check's failed verdict is what the child's next turn is told")
        specs.append(ChildSpec(
            prompt=prompt, model=model.strip(), title=title[:MAX_TITLE], tools=tuple(dict.fromkeys(tools)), files=paths,
            max_turns=_number(task, "max_turns", settings.default_turns, settings.max_turns, True, where),
            max_tokens=_number(task, "max_tokens", settings.default_tokens, settings.max_tokens, True, where),
            timeout=_number(task, "timeout", settings.default_timeout, settings.max_timeout, False, where),
            check=check, rounds=rounds,
        ))
    return specs


def _check(value: Any, where: str) -> Check | None:
    """A check as the model wrote it: Python source, {"python": source}, or {"rubric": text, "model": name}."""
    if value is None:
        return None
    how = (f'{where}: check must be Python source that raises when the work is wrong, or {{"rubric": "what a good '
           f'answer does", "model": "a grading model (default: the child\'s)"}}, at most {MAX_PROMPT} characters')
    if isinstance(value, str):
        value = {"python": value}
    if not isinstance(value, dict) or len(set(value) & {"python", "rubric"}) != 1 or set(value) - {"python", "rubric", "model"}:
        raise BadInput(how)
    text = value.get("python", value.get("rubric"))
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_PROMPT:
        raise BadInput(how)
    model = value.get("model", "")
    if "python" in value and "model" in value:
        raise BadInput(f"{where}: a python check runs no model; model goes with a rubric")
    if not isinstance(model, str) or len(model) > 200:
        raise BadInput(f"{where}: the check's model must be a model name")
    return Check(code=text) if "python" in value else Check(rubric=text, model=model.strip())
