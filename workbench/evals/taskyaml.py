"""A task set written in YAML: the same tasks as a JSONL file's, each with the line it starts on.

The file is a list of tasks, or a mapping whose `tasks` is that list (other top-level keys are refused, so a typo
is not silently ignored). Only what JSON can say is read: mappings with text keys, lists, text, booleans, null,
and numbers as strict as the JSONL reader's (no NaN or infinity, integers of 64 bits, no `0x`, `1_000` or `1:30`).
Anchors and aliases are refused: a task set has no need of them, and they are how a small YAML file becomes a huge
value (the "billion laughs"). Dates stay text. A refusal names the file and the line (docs/evals.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ..plugins.errors import ConfigError
from ..plugins.settings import NumberRefused, number, parse_constant

SUFFIXES = (".yaml", ".yml")
TOP_KEYS = frozenset({"tasks"})


class _Refused(Exception):
    """What is wrong at a line of the file (1-based)."""

    def __init__(self, line: int, why: str):
        super().__init__(why)
        self.line = line


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, narrowed to JSON's values."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _Refused(self.peek_event().start_mark.line + 1, "anchors and aliases (*name) are not read in a task set")
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise _Refused(event.start_mark.line + 1, "anchors and aliases (&name) are not read in a task set")
        return super().compose_node(parent, index)


def _scalar_as(kind: type[int] | type[float]) -> Any:
    def construct(loader: _Loader, node: yaml.ScalarNode) -> int | float:
        text = str(loader.construct_scalar(node))
        try:
            if kind is float and text.lower().lstrip("+-") in (".inf", ".nan"):
                parse_constant(text)
            return number(text, kind)
        except NumberRefused as e:
            raise _Refused(node.start_mark.line + 1, str(e)) from None
    return construct


def _text(loader: _Loader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise _Refused(key_node.start_mark.line + 1, "merge keys (<<) are not read in a task set")
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise _Refused(key_node.start_mark.line + 1, f"a key must be text, not {type(key).__name__} ({key!r:.40})")
        if key in out:
            raise _Refused(key_node.start_mark.line + 1, f"the key {key[:60]!r} is given twice")
        out[key] = loader.construct_object(value_node, deep=True)
    return out


def _unreadable(loader: _Loader, node: yaml.Node) -> Any:
    raise _Refused(node.start_mark.line + 1, f"{node.tag} is not a value a task set can hold (JSON's values only)")


_Loader.yaml_constructors = {}  # PyYAML's constructor table is a class attribute: this one's own, not SafeLoader's
for tag, fn in {"tag:yaml.org,2002:null": yaml.SafeLoader.construct_yaml_null,
                "tag:yaml.org,2002:bool": yaml.SafeLoader.construct_yaml_bool,
                "tag:yaml.org,2002:int": _scalar_as(int), "tag:yaml.org,2002:float": _scalar_as(float),
                "tag:yaml.org,2002:str": _text, "tag:yaml.org,2002:timestamp": _text,
                "tag:yaml.org,2002:seq": yaml.SafeLoader.construct_sequence, "tag:yaml.org,2002:map": _mapping,
                None: _unreadable}.items():
    _Loader.add_constructor(tag, fn)


def yaml_tasks(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line, value) of each task of a YAML task set; ConfigError names the file and the line of what is wrong."""
    loader = _Loader(text)
    try:
        try:
            root = loader.get_single_node()
            if root is None:
                return
            if isinstance(root, yaml.MappingNode):
                top = _mapping(loader, root)  # its values constructed too: small next to the task set itself
                extra = sorted(set(top) - TOP_KEYS)
                if extra:
                    raise _Refused(root.start_mark.line + 1,
                                   f"unknown top-level key {extra[0][:60]!r}; a YAML task set is a list of tasks, or "
                                   "a mapping whose 'tasks' is that list")
                seq = next((v for k, v in root.value if loader.construct_object(k) == "tasks"), None)
            else:
                seq = root
            if not isinstance(seq, yaml.SequenceNode):
                raise _Refused((seq or root).start_mark.line + 1,
                               "a YAML task set is a list of tasks, or a mapping whose 'tasks' is that list")
            for item in seq.value:
                yield item.start_mark.line + 1, loader.construct_object(item, deep=True)
        except _Refused as e:
            raise ConfigError(f"{path}:{e.line}: {e}") from None
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            at = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}{at}: not YAML ({e.problem or e.context})") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not YAML ({str(e).splitlines()[0][:200]})") from None
        except RecursionError:
            raise ConfigError(f"{path}: not YAML that can be read (nested too deeply)") from None
    finally:
        loader.dispose()
