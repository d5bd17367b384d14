"""Task sets in YAML: the same tasks as JSONL, each refusal naming the file and line; only JSON's values are read."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from workbench.errors import ConfigError
from workbench.evals import load_tasks, task_to_json

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "evals" / "basic.jsonl"


def write(tmp_path: Path, text: str | bytes, name: str = "tasks.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


GOOD = """\
# two tasks, the second with a file and limits
- id: add
  prompt: What is 2 + 2?
  verifier:
    kind: python
    code: assert "4" in answer
- id: mean
  prompt: |
    Fix mean() in stats.py.
    It divides by the wrong number.
  files:
    stats.py: "def mean(xs): return sum(xs) / (len(xs) - 1)\\n"
  limits: {turns: 4, seconds: 60.5}
  tags: [python, fix]
  verifier: {kind: python, code: "from stats import mean; assert mean([1, 3]) == 2", timeout: 30}
"""


def test_a_yaml_task_set_loads_the_same_tasks_as_its_jsonl(tmp_path):
    tasks = load_tasks(write(tmp_path, GOOD))
    assert [t.id for t in tasks] == ["add", "mean"]
    assert tasks[1].prompt == "Fix mean() in stats.py.\nIt divides by the wrong number.\n"
    assert tasks[1].files == {"stats.py": b"def mean(xs): return sum(xs) / (len(xs) - 1)\n"}
    assert (tasks[1].limits.turns, tasks[1].limits.seconds, tasks[1].tags) == (4, 60.5, ("python", "fix"))
    same = write(tmp_path, "\n".join(json.dumps(task_to_json(t)) for t in tasks), "same.jsonl")
    assert [task_to_json(t) for t in load_tasks(same)] == [task_to_json(t) for t in tasks]
    # a mapping whose `tasks` is the list, and .yml
    wrapped = write(tmp_path, "tasks:\n" + "".join("  " + ln + "\n" for ln in GOOD.splitlines()), "wrapped.yml")
    assert [task_to_json(t) for t in load_tasks(wrapped)] == [task_to_json(t) for t in tasks]


def test_the_example_set_written_as_yaml_loads_equal(tmp_path):
    """Every kind of task the example set has (python, graded, files by path, scripted) survives YAML."""
    import yaml

    objs = [json.loads(ln) for ln in EXAMPLE.read_text().splitlines() if ln.strip() and not ln.startswith("//")]
    folder = tmp_path / "set"
    shutil.copytree(EXAMPLE.parent, folder)  # the files the tasks name by path sit in the task set's folder
    as_yaml = folder / "basic.yaml"
    as_yaml.write_text(yaml.safe_dump(objs, sort_keys=False, allow_unicode=True))
    assert [task_to_json(t) for t in load_tasks(as_yaml)] == [task_to_json(t) for t in load_tasks(EXAMPLE)]


BAD = [
    # (text, line, words)
    ("- id: t1\n  prompt: p\n  verifier: {kind: python, code: '1'}\n- id: t2\n  prompt: p\n  verifier: {kind: python}\n",
     4, "task 't2': verifier.code: a python verifier needs its code"),
    ("- id: t1\n  prompt: p\n  verifier: {kind: python, code: '1', timeout: .nan}\n", 3, "not a JSON number"),
    ("- id: t1\n  prompt: p\n  verifier: {kind: python, code: '1', timeout: .inf}\n", 3, "not a JSON number"),
    ("- id: t1\n  prompt: p\n  limits: {turns: 0x10}\n  verifier: {kind: python, code: '1'}\n", 3, "is not an integer"),
    ("- id: t1\n  prompt: p\n  limits: {turns: 1_000}\n  verifier: {kind: python, code: '1'}\n", 3, "is not an integer"),
    ("- id: t1\n  prompt: p\n  limits: {turns: " + "9" * 40 + "}\n  verifier: {kind: python, code: '1'}\n", 3, "digits"),
    ("- &a {id: t1, prompt: p, verifier: {kind: python, code: '1'}}\n- *a\n", 1, "anchors and aliases"),
    ("- id: t1\n  prompt: p\n  verifier: {kind: python, code: '1'}\n  <<: {tags: [x]}\n", 4, "merge keys"),
    ("- id: t1\n  prompt: !!python/object:os.system echo\n  verifier: {kind: python, code: '1'}\n", 2, "is not a value a task set can hold"),
    ("- id: t1\n  prompt: !!binary aGk=\n  verifier: {kind: python, code: '1'}\n", 2, "is not a value a task set can hold"),
    ("- id: t1\n  prompt: p\n  1: x\n  verifier: {kind: python, code: '1'}\n", 3, "a key must be text, not int"),
    ("- id: t1\n  prompt: p\n  prompt: q\n  verifier: {kind: python, code: '1'}\n", 3, "the key 'prompt' is given twice"),
    ("- id: t1\n  prompt: [unclosed\n", 3, "not YAML"),
    ("- id: t1\n\tprompt: tab\n", 2, "not YAML"),
    ("{tasks: [], task: []}\n", 1, "unknown top-level key 'task'"),
    ("just text\n", 1, "a YAML task set is a list of tasks"),
    ("tasks: {id: t1}\n", 1, "a YAML task set is a list of tasks"),
    ("- [1, 2]\n", 1, "a task is a JSON object, not list"),
    ("- id: t1\n  prompt: p\n  verifier: {kind: python, code: '1'}\n- id: t1\n  prompt: q\n  verifier: {kind: python, code: '2'}\n",
     4, "two tasks have the id 't1'"),
    ("- id: t1\n  prompt: p\n  verifier: {kind: python, code: '1'}\n  unknown: 1\n", 1, "task 't1': unknown: unknown task field"),
]


@pytest.mark.parametrize("text, line, words", BAD)
def test_a_bad_yaml_task_set_is_refused_naming_its_file_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_tasks(path)
    assert str(e.value).startswith(f"{path}:{line}: ") and words in str(e.value), str(e.value)


def test_hostile_yaml_is_refused_quickly_and_whole(tmp_path):
    # the billion laughs: nine levels of aliases, each nine times the one before
    laughs = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]\n" for i in range(1, 9))
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_tasks(write(tmp_path, laughs))
    path = write(tmp_path, "[" * 100_000 + "]" * 100_000)  # nested past any reader's depth
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}(:\d+)?: not YAML"):
        load_tasks(path)
    path = write(tmp_path, b"- id: t1\n  prompt: \xff\xfe\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: not UTF-8"):
        load_tasks(path)
    for empty in ("", "# nothing\n", "tasks: []\n"):
        path = write(tmp_path, empty)
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: the task set is empty"):
            load_tasks(path)
    # script-bearing text is text: kept as written, for the model and the report to escape where they show it
    t = load_tasks(write(tmp_path, "- id: x\n  prompt: \"<script>alert(1)</script>\"\n  verifier: {kind: python, code: '1'}\n"))
    assert t[0].prompt == "<script>alert(1)</script>"


def test_dates_and_yes_stay_what_json_would_read(tmp_path):
    """An unquoted date is text (not a datetime the log cannot store); `yes` is YAML's boolean, and a prompt that is
    a boolean is refused by the task's own check."""
    t = load_tasks(write(tmp_path, "- id: 2026-12-02\n  prompt: due 2026-12-02\n  verifier: {kind: python, code: '1'}\n"))
    assert t[0].id == "2026-12-02"
    path = write(tmp_path, "- id: t1\n  prompt: yes\n  verifier: {kind: python, code: '1'}\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:1: task 't1': prompt"):
        load_tasks(path)
