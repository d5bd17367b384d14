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


class TaskRefused(ConfigError):
    """A task a run could not use, named by where it came from, its id and the field that is wrong."""

    def __init__(self, where: str, field: str, why: str):
        super().__init__(f"{where}: {field}: {why}" if field else f"{where}: {why}")
        self.field, self.why = field, why

    def at(self, where: str) -> TaskRefused:
        """The same refusal, named by a fuller `where` (the file and line a task came from)."""
        return TaskRefused(where, self.field, self.why)


def _number(where: str, name: str, value: Any, *, whole: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (whole and not float(value).is_integer()):
        kind = "a whole number" if whole else "a number"
        raise TaskRefused(where, f"limits.{name}", f"must be {kind} >= 0 (0: no limit), not {str(value)[:40]!r}")
    return value


def _file_field(name: Any) -> str:
    return f"files[{str(name)[:80]!r}]"


def _relative(where: str, name: Any, field: str | None = None) -> str:
    """A file name that stays inside the workspace: relative, no `..`, no NUL."""
    field = field or _file_field(name)
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        raise TaskRefused(where, field, f"a file name must be a non-empty relative path, not {str(name)[:80]!r}")
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or len(name) > 500:
        raise TaskRefused(where, field, "must be a relative path inside the workspace (no '..', no leading '/')")
    try:
        check_path(name)  # what the workspace module will write
    except FileRefused as e:
        raise TaskRefused(where, field, str(e)) from None
    return str(p)


def check_task(t: Task) -> None:
    """Raise TaskRefused (naming the task and the field) for anything a run could not use."""
    where = f"task {str(t.id)[:60]!r}"
    if not isinstance(t.id, str) or not TASK_ID.fullmatch(t.id):
        raise TaskRefused(where, "id", "an id is 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit")
    if not isinstance(t.prompt, str) or not t.prompt.strip() or len(t.prompt) > MAX_PROMPT_CHARS:
        raise TaskRefused(where, "prompt", f"the prompt must be non-empty text of at most {MAX_PROMPT_CHARS:,} characters")
    v = t.verifier
    if not isinstance(v, Verifier) or v.kind not in VERIFIER_KINDS:
        raise TaskRefused(where, "verifier.kind", f"the verifier kind must be one of {', '.join(VERIFIER_KINDS)}")
    what = "code" if v.kind == "python" else "rubric"
    text = v.code if v.kind == "python" else v.rubric
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_CODE_CHARS:
        raise TaskRefused(where, f"verifier.{what}",
                          f"a {v.kind} verifier needs its {what}: non-empty text of at most {MAX_CODE_CHARS:,} characters")
    if isinstance(v.timeout, bool) or not isinstance(v.timeout, (int, float)) or not math.isfinite(v.timeout) or v.timeout <= 0:
        raise TaskRefused(where, "verifier.timeout", "the verifier's timeout must be a positive number of seconds")
    for name, data in t.files.items():
        _relative(where, name)
        if not isinstance(data, bytes) or len(data) > MAX_FILE_BYTES:
            raise TaskRefused(where, _file_field(name), f"must be bytes of at most {MAX_FILE_BYTES:,}")
    lim = t.limits
    _number(where, "turns", lim.turns, whole=True)
    _number(where, "tokens", lim.tokens, whole=True)
    _number(where, "seconds", lim.seconds, whole=False)
    if lim.turns < 1:
        raise TaskRefused(where, "limits.turns", "limits.turns must be at least 1")


# -- JSONL -----------------------------------------------------------------------------

TASK_KEYS = frozenset({"id", "prompt", "files", "limits", "verifier", "scripted", "tags"})
VERIFIER_KEYS = frozenset({"kind", "code", "rubric", "model", "timeout"})
LIMIT_KEYS = frozenset({"turns", "tokens", "seconds"})


def _files(where: str, raw: Any, base: Path | None) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TaskRefused(where, "files", "must be an object: {\"name\": \"text\"} or "
                                          "{\"name\": {\"path\": \"file next to the task set\"}}")
    out: dict[str, bytes] = {}
    for name, spec in raw.items():
        field = _file_field(name)
        name = _relative(where, name)
        if isinstance(spec, str):
            out[name] = spec.encode()
        elif isinstance(spec, dict) and set(spec) == {"base64"} and isinstance(spec["base64"], str):
            try:
                out[name] = base64.b64decode(spec["base64"], validate=True)
            except ValueError:
                raise TaskRefused(where, field, "base64 is not valid base64") from None
        elif isinstance(spec, dict) and set(spec) == {"path"} and isinstance(spec["path"], str):
            if base is None:
                raise TaskRefused(where, field, "names a path, but these tasks were not read from a file")
            src = (base / _relative(where, spec["path"], field)).resolve()
            if not src.is_relative_to(base.resolve()) or not src.is_file():
                raise TaskRefused(where, field, f"{spec['path']!r} is not a file inside {base}")
            if src.stat().st_size > MAX_FILE_BYTES:
                raise TaskRefused(where, field, f"is over {MAX_FILE_BYTES:,} bytes")
            out[name] = src.read_bytes()
        else:
            raise TaskRefused(where, field, "must be text, {\"path\": ...} or {\"base64\": ...}")
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
            raise TaskRefused(where, "scripted", "scripted is a list of turns, each {\"code\": [\"...\"], "
                                                 "\"answer\": \"...\"} or a string of code")
        code = turn.get("code", [])
        code = [code] if isinstance(code, str) else code
        if not isinstance(code, list) or not all(isinstance(c, str) for c in code) or not isinstance(turn.get("answer", ""), str):
            raise TaskRefused(where, "scripted", "scripted code is a list of strings and its answer a string")
        out.append({"code": code, "answer": turn.get("answer", "")})
    return tuple(out)


def _verifier(where: str, v: Any) -> Verifier:
    if not isinstance(v, dict):
        raise TaskRefused(where, "verifier", "the verifier must be {\"kind\": \"python\", \"code\": ...} or "
                                             "{\"kind\": \"rubric\", \"rubric\": ...}")
    if v.get("kind", "python") not in VERIFIER_KINDS:
        raise TaskRefused(where, "verifier.kind", f"the verifier kind must be one of {', '.join(VERIFIER_KINDS)}, "
                                                  f"not {str(v.get('kind'))[:40]!r}")
    unknown = sorted(map(str, set(v) - VERIFIER_KEYS))
    if unknown:
        raise TaskRefused(where, f"verifier.{unknown[0][:60]}", f"unknown; a verifier has {', '.join(sorted(VERIFIER_KEYS))}")
    for key in ("code", "rubric", "model"):
        if key in v and not isinstance(v[key], str):
            raise TaskRefused(where, f"verifier.{key}", f"verifier.{key} must be text")
    return Verifier(kind=v.get("kind", "python"), code=v.get("code", ""), rubric=v.get("rubric", ""),
                    model=v.get("model", ""), timeout=v.get("timeout", 120.0))


def _limits(where: str, raw: Any) -> TaskLimits:
    limits = raw or {}
    if not isinstance(limits, dict):
        raise TaskRefused(where, "limits", "limits must be an object with turns, tokens and/or seconds")
    unknown = sorted(map(str, set(limits) - LIMIT_KEYS))
    if unknown:
        raise TaskRefused(where, f"limits.{unknown[0][:60]}", "unknown; limits must be an object with turns, tokens "
                                                               "and/or seconds")
    return TaskLimits(**limits)


def task_from_json(obj: Any, *, base: Path | None = None, where: str = "") -> Task:
    """A Task from its JSON form (docs/evals.md); TaskRefused names `where` it came from, its id and the wrong field."""
    at = f"{where}: " if where else ""
    if not isinstance(obj, dict):
        raise ConfigError(f"{at}a task is a JSON object, not {type(obj).__name__}")
    where = f"{at}task {str(obj['id'])[:60]!r}" if "id" in obj else f"{at}task (no id)"
    unknown = sorted(map(str, set(obj) - TASK_KEYS))
    if unknown:
        raise TaskRefused(where, unknown[0][:60], f"unknown task field; known: {', '.join(sorted(TASK_KEYS))}")
    tags = obj.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(x, str) and len(x) <= 100 for x in tags):
        raise TaskRefused(where, "tags", "tags must be a list of short strings")
    verifier, limits = _verifier(where, obj.get("verifier")), _limits(where, obj.get("limits"))
    files, scripted = _files(where, obj.get("files"), base), _scripted(where, obj.get("scripted"))
    try:
        return Task(id=obj.get("id"),  # type: ignore[arg-type]  # check_task says what is wrong with it
                    prompt=obj.get("prompt"),  # type: ignore[arg-type]
                    verifier=verifier, files=files, limits=limits, scripted=scripted, tags=tuple(tags))
    except TaskRefused as e:  # check_task knows the task by its id only: name the file and line too
        raise e.at(where) from None


def _text(path: Path) -> str:
    """A task set file's text; ConfigError if it is missing, too big or not UTF-8 (naming the line)."""
    if not path.is_file():
        raise ConfigError(f"no task set at {path}: give a .jsonl or .yaml file (docs/evals.md)")
    if path.stat().st_size > MAX_TASK_FILE_BYTES:
        raise ConfigError(f"{path} is over {MAX_TASK_FILE_BYTES:,} bytes")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}:{bad}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _lines(path: Path) -> Iterable[tuple[int, Any]]:
    """(line number, value) of each task of a task set file (JSONL, or YAML by its suffix); ConfigError names the
    file and line."""
    from .taskyaml import SUFFIXES, yaml_tasks  # PyYAML at the first task set read, not with every CLI command

    text = _text(path)
    if path.suffix.lower() in SUFFIXES:
        yield from yaml_tasks(path, text)
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            yield n, json.loads(line, parse_constant=parse_constant, parse_int=parse_int, parse_float=parse_float)
        except NumberRefused as e:
            raise ConfigError(f"{path}:{n}: {e}") from None
        except ValueError as e:
            raise ConfigError(f"{path}:{n}: not JSON ({e})") from None
        except RecursionError:
            raise ConfigError(f"{path}:{n}: not JSON (nested too deeply)") from None


def load_tasks(source: str | Path | Iterable[Task | Mapping[str, Any]]) -> list[Task]:
    """Tasks from a JSONL or YAML file, or from Tasks / JSON objects; ids must be unique."""
    located: list[tuple[Task, str]] = []  # each task and where it came from, for the refusals that follow
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        for n, obj in _lines(path):
            if len(located) == MAX_TASKS:
                raise ConfigError(f"{path}:{n}: more than {MAX_TASKS:,} tasks; at most {MAX_TASKS:,} in one run")
            located.append((task_from_json(obj, base=path.parent, where=f"{path}:{n}"), f"{path}:{n}: "))
        if not located:
            raise ConfigError(f"{path}: the task set is empty")
    else:
        located = [(t if isinstance(t, Task) else task_from_json(t), "") for t in source]
        if not located:
            raise ConfigError("the task set is empty")
        if len(located) > MAX_TASKS:
            raise ConfigError(f"{len(located):,} tasks; at most {MAX_TASKS:,} in one run")
    first: dict[str, str] = {}
    for t, at in located:
        if t.id in first:
            raise TaskRefused(f"{at}task {t.id!r}", "id", f"two tasks have the id {t.id!r}"
                              f"{f' (the first at {first[t.id]})' if first[t.id] else ''}; ids must be unique within a task set")
        first[t.id] = at.rstrip(": ")
    return [t for t, _ in located]


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
