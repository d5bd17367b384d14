"""Task sets: the shipped example set loads, the format refuses hostile input with a message, JSON round-trips."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from workbench.errors import ConfigError
from workbench.evals import Task, TaskLimits, Verifier, load_tasks, task_from_json, task_to_json
from workbench.evals.tasks import MAX_PROMPT_CHARS, select

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "evals" / "basic.jsonl"


def line(**kw) -> dict:
    return {"id": "t1", "prompt": "do it", "verifier": {"kind": "python", "code": "assert True"}, **kw}


def write(tmp_path: Path, *objs, raw: bytes | None = None) -> Path:
    p = tmp_path / "tasks.jsonl"
    p.write_bytes(raw if raw is not None else "\n".join(json.dumps(o) for o in objs).encode())
    return p


def test_the_example_set_has_twenty_offline_tasks_of_every_kind():
    tasks = load_tasks(EXAMPLE)
    assert len(tasks) >= 20
    tags = {tag for t in tasks for tag in t.tags}
    assert {"pandas", "bug", "plot", "numeric", "outcome", "rubric"} <= tags
    assert all(t.scripted for t in tasks), "every example task carries its offline solution"
    assert {t.verifier.kind for t in tasks} == {"python", "rubric"}
    assert b"month,region,units,price" in next(t for t in tasks if "sales.csv" in t.files).files["sales.csv"]


def test_a_task_round_trips_through_json_and_its_digest_follows_what_is_graded(tmp_path):
    t = Task("x", "p", Verifier.python("assert 1"), files={"a/b.bin": bytes(range(256))}, limits=TaskLimits(turns=2),
             scripted=({"code": ["print(1)"], "answer": "{output}"},), tags=("k",))
    back = task_from_json(json.loads(json.dumps(task_to_json(t))))
    assert back == t and back.digest() == t.digest()
    assert Task("x", "p", Verifier.python("assert 2")).digest() != Task("x", "p", Verifier.python("assert 1")).digest()
    assert Task("x", "p", Verifier.python("assert 1"), files={"f": b"1"}).digest() != \
        Task("x", "p", Verifier.python("assert 1"), files={"f": b"2"}).digest()


# each kind of mistake: the task (id t1 unless it says otherwise), the field named, words of the message
MISTAKES = [
    (line(id="../etc"), "'../etc'", "id", "an id is"),
    (line(id=""), "''", "id", "an id is"),
    ({"prompt": "p", "verifier": {"code": "1"}}, "(no id)", "id", "an id is"),
    (line(prompt="   "), "'t1'", "prompt", "prompt must be non-empty"),
    (line(prompt="x" * (MAX_PROMPT_CHARS + 1)), "'t1'", "prompt", "prompt must be non-empty"),
    (line(prompt=7), "'t1'", "prompt", "prompt must be non-empty"),
    (line(verifier="assert True"), "'t1'", "verifier", "verifier must be"),
    (line(verifier={"kind": "shell", "code": "true"}), "'t1'", "verifier.kind", "kind must be one of python, rubric"),
    (line(verifier={"kind": "python", "cmd": "x"}), "'t1'", "verifier.cmd", "unknown"),
    (line(verifier={"kind": "python"}), "'t1'", "verifier.code", "a python verifier needs its code"),
    (line(verifier={"kind": "rubric", "code": "x"}), "'t1'", "verifier.rubric", "a rubric verifier needs its rubric"),
    (line(verifier={"kind": "python", "code": "1", "timeout": -1}), "'t1'", "verifier.timeout", "timeout must be a positive"),
    (line(verifier={"kind": "python", "code": 5}), "'t1'", "verifier.code", "verifier.code must be text"),
    (line(files=["a.txt"]), "'t1'", "files", "must be an object"),
    (line(files={"../escape.txt": "x"}), "'t1'", "files['../escape.txt']", "relative path inside the workspace"),
    (line(files={"/abs.txt": "x"}), "'t1'", "files['/abs.txt']", "relative path inside the workspace"),
    (line(files={"nul\u0000.txt": "x"}), "'t1'", "files['nul\\x00.txt']", "non-empty relative path"),
    (line(files={"bell\u0007.txt": "x"}), "'t1'", "files['bell\\x07.txt']", "contains control characters"),
    (line(files={"a.txt": 5}), "'t1'", "files['a.txt']", "must be text"),
    (line(files={"a.txt": {"base64": "!!!"}}), "'t1'", "files['a.txt']", "not valid base64"),
    (line(limits={"turns": 0}), "'t1'", "limits.turns", "at least 1"),
    (line(limits={"turns": 1.5}), "'t1'", "limits.turns", "whole number"),
    (line(limits={"seconds": -3}), "'t1'", "limits.seconds", "a number >= 0"),
    (line(limits={"tokens": "many"}), "'t1'", "limits.tokens", "a whole number >= 0"),
    (line(limits=[3]), "'t1'", "limits", "limits must be an object"),
    (line(limits={"forever": True}), "'t1'", "limits.forever", "unknown"),
    (line(scripted=[{"code": [1]}]), "'t1'", "scripted", "scripted code"),
    (line(scripted=[{"shell": "x"}]), "'t1'", "scripted", "scripted is a list"),
    (line(tags="bug"), "'t1'", "tags", "tags must be a list"),
    (line(extra=1), "'t1'", "extra", "unknown task field"),
]


@pytest.mark.parametrize("obj, task, field, words", MISTAKES)
def test_a_bad_task_is_refused_naming_the_task_and_field(obj, task, field, words):
    with pytest.raises(ConfigError) as e:
        load_tasks([obj])
    assert str(e.value).startswith(f"task {task}: {field}: ") and words in str(e.value), str(e.value)


@pytest.mark.parametrize("obj, task, field, words", MISTAKES)
def test_a_bad_task_in_a_file_is_refused_naming_its_file_line_task_and_field(tmp_path, obj, task, field, words):
    """The mistake on line 4, after a good task, a comment and a blank line (which count as lines too)."""
    good = {**line(), "id": "good"}
    path = write(tmp_path, raw=(json.dumps(good) + "\n// a comment\n\n" + json.dumps(obj) + "\n").encode())
    with pytest.raises(ConfigError) as e:
        load_tasks(path)
    assert str(e.value).startswith(f"{path}:4: task {task}: {field}: ") and words in str(e.value), str(e.value)


def test_a_bad_file_is_refused_with_its_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: not JSON"):
        load_tasks(write(tmp_path, raw=json.dumps(line()).encode() + b"\n{nope"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:1: a task is a JSON object, not list"):
        load_tasks(write(tmp_path, raw=b"[1, 2]"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:1: .*not a JSON number"):
        load_tasks(write(tmp_path, raw=b'{"id": "a", "prompt": "p", "verifier": {"kind": "python", "code": "1", "timeout": NaN}}'))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:3: not UTF-8"):
        load_tasks(write(tmp_path, raw=json.dumps(line()).encode() + b'\n\n{"id": "\xff"}'))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:1: not JSON"):  # deeper than the JSON reader goes
        load_tasks(write(tmp_path, raw=b"[" * 100_000 + b"]" * 100_000))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:3: task 't1': id: two tasks have the id 't1' \(the first at {re.escape(str(path))}:1\)"):
        load_tasks(write(tmp_path, line(), {**line(), "id": "t2"}, line()))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: task 't1': files\['d.csv'\]: 'missing.csv' is not a file inside"):
        load_tasks(write(tmp_path, {**line(), "id": "t0"}, line(files={"d.csv": {"path": "missing.csv"}})))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: the task set is empty"):
        load_tasks(write(tmp_path, raw=b"\n\n// only a comment\n"))
    with pytest.raises(ConfigError, match="no task set"):
        load_tasks(tmp_path / "missing.jsonl")


def test_a_task_that_names_a_path_outside_a_file_is_refused():
    with pytest.raises(ConfigError, match=r"^task 't1': files\['a.txt'\]: names a path, but these tasks were not read"):
        load_tasks([line(files={"a.txt": {"path": "data.csv"}})])


def test_files_by_path_stay_inside_the_task_sets_folder(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    outside = tmp_path.parent / f"{tmp_path.name}-secret.txt"
    outside.write_text("secret")
    os.symlink(outside, tmp_path / "link.txt")
    ok = load_tasks(write(tmp_path, line(files={"d.csv": {"path": "data.csv"}})))
    assert ok[0].files == {"d.csv": b"a,b\n1,2\n"}
    for path in ("../" + outside.name, "link.txt", "missing.csv"):
        with pytest.raises(ConfigError, match="inside"):
            load_tasks(write(tmp_path, line(files={"d.csv": {"path": path}})))


def test_select_keeps_the_order_and_refuses_an_unknown_id():
    tasks = load_tasks(EXAMPLE)
    ids = [tasks[3].id, tasks[0].id]
    assert [t.id for t in select(tasks, ids)] == [tasks[0].id, tasks[3].id]
    with pytest.raises(ConfigError, match="no task 'nope'"):
        select(tasks, ["nope"])


def test_the_readmes_own_task_loads_and_its_check_says_what_it_means():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### Evals"):readme.index("## What survives what")]
    block = section.split("```json\n", 1)[1].split("\n```", 1)[0]
    (task,) = load_tasks([json.loads(block)])
    assert task.files == {"data.csv": b"x\n1\n2\n6\n"}

    def check(answer: str) -> None:
        exec(compile(task.verifier.code, "<verifier>", "exec"), {"answer": answer})

    check("The mean of x is 3.0.")
    with pytest.raises(AssertionError, match="the mean of x is 3.0"):
        check("It is 2.")
