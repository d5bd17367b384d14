"""Eval tasks: what an attempt is given (a prompt, files, limits) and how it is graded (a verifier).

A task set is a JSONL file (one task per line) or a list of `Task`s made in Python
(docs/evals.md has the format). A task's files are placed in the attempt's workspace
before its first turn; its verifier grades the workspace (and the final answer) after
each turn, in hands of its own (workbench/evals/verify.py).

    tasks = load_tasks("examples/evals/basic.jsonl")
    tasks = [Task("two", "What is 1 + 1?", verifier=Verifier.python("assert answer.strip().endswith('2')"))]
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..plugins.errors import ConfigError
from ..plugins.hands import FileRefused, check_path
from ..plugins.settings import NumberRefused, parse_constant, parse_float, parse_int

MAX_TASKS = 10_000
MAX_TASK_FILE_BYTES = 64 * 1024 * 1024  # a task set file
MAX_PROMPT_CHARS = 200_000
MAX_FILE_BYTES = 16 * 1024 * 1024  # one file placed in a workspace
MAX_CODE_CHARS = 200_000  # a verifier's code or rubric
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
VERIFIER_KINDS = ("python", "rubric")


@dataclass(frozen=True)
class TaskLimits:
    """What one attempt may spend; 0 means no limit of that kind."""

    turns: int = 3  # agent turns in outcome mode: the first, plus one per failed verdict fed back
    tokens: int = 0  # input + output tokens of the agent's model calls, over all turns
    seconds: float = 600.0  # wall time of the whole attempt, verifiers included


@dataclass(frozen=True)
class Verifier:
    """How a task is graded: Python code run against a copy of the workspace, or a rubric a model grades."""

    kind: str  # python | rubric
    code: str = ""  # kind python: assertions over `answer` (the final text) and the files in the working directory
    rubric: str = ""  # kind rubric: what a good answer does, for the grading model
    model: str = ""  # kind rubric: the grading model (empty: the eval's grader setting, else the attempt's model)
    timeout: float = 120.0  # seconds the check may run

    @classmethod
    def python(cls, code: str, timeout: float = 120.0) -> Verifier:
        return cls("python", code=code, timeout=timeout)

    @classmethod
    def graded(cls, rubric: str, model: str = "") -> Verifier:
        return cls("rubric", rubric=rubric, model=model)


@dataclass(frozen=True)
class Task:
    """One eval task: a prompt, files for the workspace, limits, a verifier, and an offline solution."""

    id: str
    prompt: str
    verifier: Verifier
    files: Mapping[str, bytes] = field(default_factory=dict)  # relative path -> content
    limits: TaskLimits = field(default_factory=TaskLimits)
    # for the scripted model (`scripted:eval`): per turn, the code it runs and the answer it gives
    scripted: tuple[Mapping[str, Any], ...] = ()
    tags: tuple[str, ...] = ()

    def digest(self) -> str:
        """A hash of what is graded and given (prompt, files, verifier, limits): a resumed run checks it."""
        h = hashlib.sha256()
        h.update(json.dumps({"prompt": self.prompt, "verifier": asdict(self.verifier), "limits": asdict(self.limits)},
                            sort_keys=True).encode())
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()[:16]

    def __post_init__(self) -> None:
        check_task(self)


def _fail(where: str, why: str) -> ConfigError:
    return ConfigError(f"{where}: {why}")


def _number(where: str, name: str, value: Any, *, whole: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (whole and not float(value).is_integer()):
        kind = "a whole number" if whole else "a number"
        raise _fail(where, f"limits.{name} must be {kind} >= 0 (0: no limit), not {str(value)[:40]!r}")
    return value


def _relative(where: str, name: Any) -> str:
    """A file name that stays inside the workspace: relative, no `..`, no NUL."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        raise _fail(where, f"a file name must be a non-empty relative path, not {str(name)[:80]!r}")
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or len(name) > 500:
        raise _fail(where, f"file {name[:80]!r} must be a relative path inside the workspace (no '..', no leading '/')")
    try:
        check_path(name)  # what the workspace module will write
    except FileRefused as e:
        raise _fail(where, f"file {name[:80]!r}: {e}") from None
    return str(p)


def check_task(t: Task) -> None:
    """Raise ConfigError (naming the task and the field) for anything a run could not use."""
    where = f"task {str(t.id)[:60]!r}"
    if not isinstance(t.id, str) or not TASK_ID.fullmatch(t.id):
        raise _fail(where, "an id is 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit")
    if not isinstance(t.prompt, str) or not t.prompt.strip() or len(t.prompt) > MAX_PROMPT_CHARS:
        raise _fail(where, f"the prompt must be non-empty text of at most {MAX_PROMPT_CHARS:,} characters")
    v = t.verifier
    if not isinstance(v, Verifier) or v.kind not in VERIFIER_KINDS:
        raise _fail(where, f"the verifier kind must be one of {', '.join(VERIFIER_KINDS)}")
    text = v.code if v.kind == "python" else v.rubric
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_CODE_CHARS:
        what = "code" if v.kind == "python" else "rubric"
        raise _fail(where, f"a {v.kind} verifier needs its {what}: non-empty text of at most {MAX_CODE_CHARS:,} characters")
    if isinstance(v.timeout, bool) or not isinstance(v.timeout, (int, float)) or not math.isfinite(v.timeout) or v.timeout <= 0:
        raise _fail(where, "the verifier's timeout must be a positive number of seconds")
    for name, data in t.files.items():
        _relative(where, name)
        if not isinstance(data, bytes) or len(data) > MAX_FILE_BYTES:
            raise _fail(where, f"file {name!r} must be bytes of at most {MAX_FILE_BYTES:,}")
    lim = t.limits
    _number(where, "turns", lim.turns, whole=True)
    _number(where, "tokens", lim.tokens, whole=True)
    _number(where, "seconds", lim.seconds, whole=False)
    if lim.turns < 1:
        raise _fail(where, "limits.turns must be at least 1")


# -- JSONL -----------------------------------------------------------------------------

TASK_KEYS = frozenset({"id", "prompt", "files", "limits", "verifier", "scripted", "tags"})


def _files(where: str, raw: Any, base: Path | None) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(where, "files must be an object: {\"name\": \"text\"} or {\"name\": {\"path\": \"file next to the task set\"}}")
    out: dict[str, bytes] = {}
    for name, spec in raw.items():
        name = _relative(where, name)
        if isinstance(spec, str):
            out[name] = spec.encode()
        elif isinstance(spec, dict) and set(spec) == {"base64"} and isinstance(spec["base64"], str):
            try:
                out[name] = base64.b64decode(spec["base64"], validate=True)
            except ValueError:
                raise _fail(where, f"file {name!r}: base64 is not valid base64") from None
        elif isinstance(spec, dict) and set(spec) == {"path"} and isinstance(spec["path"], str):
            if base is None:
                raise _fail(where, f"file {name!r} names a path, but these tasks were not read from a file")
            src = (base / _relative(where, spec["path"])).resolve()
            if not src.is_relative_to(base.resolve()) or not src.is_file():
                raise _fail(where, f"file {name!r}: {spec['path']!r} is not a file inside {base}")
            if src.stat().st_size > MAX_FILE_BYTES:
                raise _fail(where, f"file {name!r} is over {MAX_FILE_BYTES:,} bytes")
            out[name] = src.read_bytes()
        else:
            raise _fail(where, f"file {name!r} must be text, {{\"path\": ...}} or {{\"base64\": ...}}")
    return out


def _scripted(where: str, raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    turns = raw if isinstance(raw, list) else [raw]
    out = []
    for turn in turns:
        if isinstance(turn, str):
            turn = {"code": [turn]}
        if not isinstance(turn, dict) or set(turn) - {"code", "answer"}:
            raise _fail(where, "scripted is a list of turns, each {\"code\": [\"...\"], \"answer\": \"...\"} or a string of code")
        code = turn.get("code", [])
        code = [code] if isinstance(code, str) else code
        if not isinstance(code, list) or not all(isinstance(c, str) for c in code) or not isinstance(turn.get("answer", ""), str):
            raise _fail(where, "scripted code is a list of strings and its answer a string")
        out.append({"code": code, "answer": turn.get("answer", "")})
    return tuple(out)


def task_from_json(obj: Any, *, base: Path | None = None, where: str = "task") -> Task:
    """A Task from its JSON form (docs/evals.md); ConfigError says which field is wrong."""
    if not isinstance(obj, dict):
        raise _fail(where, f"a task is a JSON object, not {type(obj).__name__}")
    unknown = set(obj) - TASK_KEYS
    if unknown:
        raise _fail(where, f"unknown task field(s) {', '.join(sorted(map(str, unknown)))[:200]}; known: {', '.join(sorted(TASK_KEYS))}")
    where = f"{where} {str(obj.get('id'))[:60]!r}"
    v = obj.get("verifier")
    if not isinstance(v, dict) or v.get("kind", "python") not in VERIFIER_KINDS or set(v) - {"kind", "code", "rubric", "model", "timeout"}:
        raise _fail(where, "verifier must be {\"kind\": \"python\", \"code\": ...} or {\"kind\": \"rubric\", \"rubric\": ...}")
    for key in ("code", "rubric", "model"):
        if key in v and not isinstance(v[key], str):
            raise _fail(where, f"verifier.{key} must be text")
    limits = obj.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - {"turns", "tokens", "seconds"}:
        raise _fail(where, "limits must be an object with turns, tokens and/or seconds")
    tags = obj.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(x, str) and len(x) <= 100 for x in tags):
        raise _fail(where, "tags must be a list of short strings")
    try:
        return Task(
            id=obj.get("id"),  # type: ignore[arg-type]  # check_task says what is wrong with it
            prompt=obj.get("prompt"),  # type: ignore[arg-type]
            verifier=Verifier(kind=v.get("kind", "python"), code=v.get("code", ""), rubric=v.get("rubric", ""),
                              model=v.get("model", ""), timeout=v.get("timeout", 120.0)),
            files=_files(where, obj.get("files"), base),
            limits=TaskLimits(**limits),
            scripted=_scripted(where, obj.get("scripted")),
            tags=tuple(tags),
        )
    except TypeError as e:
        raise _fail(where, str(e)) from None


def load_tasks(source: str | Path | Iterable[Task | Mapping[str, Any]]) -> list[Task]:
    """Tasks from a JSONL file, or from Tasks / JSON objects; ids must be unique."""
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ConfigError(f"no task set at {path}: give a .jsonl file (docs/evals.md)")
        if path.stat().st_size > MAX_TASK_FILE_BYTES:
            raise ConfigError(f"{path} is over {MAX_TASK_FILE_BYTES:,} bytes")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        tasks = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("//"):
                continue
            try:
                obj = json.loads(line, parse_constant=parse_constant, parse_int=parse_int, parse_float=parse_float)
            except NumberRefused as e:
                raise ConfigError(f"{path}:{n}: {e}") from None
            except ValueError as e:
                raise ConfigError(f"{path}:{n}: not JSON ({e})") from None
            except RecursionError:
                raise ConfigError(f"{path}:{n}: not JSON (nested too deeply)") from None
            tasks.append(task_from_json(obj, base=path.parent, where=f"{path.name}:{n}: task"))
    else:
        tasks = [t if isinstance(t, Task) else task_from_json(t) for t in source]
    if not tasks:
        raise ConfigError("the task set is empty")
    if len(tasks) > MAX_TASKS:
        raise ConfigError(f"{len(tasks):,} tasks; at most {MAX_TASKS:,} in one run")
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise ConfigError(f"two tasks have the id {t.id!r}; ids must be unique within a task set")
        seen.add(t.id)
    return tasks


def task_to_json(t: Task) -> dict[str, Any]:
    """A Task's JSON form (files as base64), which `task_from_json` reads back to an equal Task."""
    v = t.verifier
    return {"id": t.id, "prompt": t.prompt,
            "files": {n: {"base64": base64.b64encode(d).decode()} for n, d in t.files.items()},
            "limits": asdict(t.limits),
            "verifier": {"kind": v.kind, "code": v.code, "rubric": v.rubric, "model": v.model, "timeout": v.timeout},
            "scripted": [dict(x) for x in t.scripted], "tags": list(t.tags)}


def select(tasks: Sequence[Task], ids: Sequence[str] | None) -> list[Task]:
    """The tasks with these ids (all when None), in the task set's order; ConfigError for an unknown id."""
    if not ids:
        return list(tasks)
    known = {t.id for t in tasks}
    missing = [i for i in ids if i not in known]
    if missing:
        raise ConfigError(f"no task {missing[0]!r} in this task set")
    return [t for t in tasks if t.id in set(ids)]
