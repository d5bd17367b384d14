"""Jupyter widgets as a person sees them: their state kept from the kernel's comm messages, and each shown
widget as a tree the model reads (render.py).

A widget's state travels on comm messages (`comm_open`, then `comm_msg` with `method: update`); a notebook
draws the widget from it. `Widgets` keeps that state for one kernel, bounded (the keys a rendering needs,
`MAX_WIDGETS` widgets, `MAX_OUTPUTS` outputs per Output widget), and what each Output widget captured (the
hands are its frontend: what a `with out:` block writes is the widget's, as nbclient and JupyterLab keep it).

`tree(model_id, get)` is what one widget shows, from any source of states (these, or nbclient's):

- an Output widget: `{"kind": "Output", "outputs": [...]}`, its outputs in order (a widget among them with a
  tree of its own);
- a container (`Box`, `HBox`, `VBox`, `GridBox`, `Tab`, `Accordion`, `Stack`): `{"kind", "children": [...]}`
  and its children's `titles` when it has them;
- any other widget: `{"kind", "text"}`, one line with its description and its value (a selection's label,
  a password masked).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from . import clean
from .render import html_text

VIEW = "application/vnd.jupyter.widget-view+json"
REF = "IPY_MODEL_"
KEYS = frozenset({"_model_name", "description", "value", "index", "_options_labels", "children", "titles", "_titles",
                  "format", "outputs", "msg_id", "width", "height"})
MAX_WIDGETS = 2000  # widgets kept per kernel; the oldest go first
MAX_STATE_BYTES = 64 * 1024  # one widget's state kept (its outputs apart)
MAX_OUTPUTS = 100  # outputs an Output widget keeps, the last ones
MAX_DEPTH = 8  # containers within containers rendered
MAX_CHILDREN = 100  # children of one container rendered
MAX_TEXT = 500  # characters of a widget's value shown
CONTAINERS = frozenset({"Box", "HBox", "VBox", "GridBox", "Tab", "Accordion", "Stack"})

State = dict[str, Any]


def model_of(data: Any) -> str | None:
    """The model id of a display bundle that shows a widget, if it is one."""
    view = data.get(VIEW) if isinstance(data, dict) else None
    model = view.get("model_id") if isinstance(view, dict) else None
    return model[:100] if isinstance(model, str) else None


class Widgets:
    """The widgets of one kernel: their state as its comm messages set it, and what Output widgets captured."""

    def __init__(self, max_output_bytes: int = 1024 * 1024):
        self.states: dict[str, State] = {}
        self.max_output_bytes = max_output_bytes
        self.changed = False  # a state changed since the last call looked (collect.py looks only then)

    def get(self, model_id: str) -> State | None:
        return self.states.get(model_id)

    def comm(self, msg_type: str, c: dict[str, Any]) -> None:
        """A comm message of the kernel: a widget opened, its state updated, or closed. Anything else is ignored."""
        comm = c.get("comm_id")
        if not isinstance(comm, str):
            return
        comm, data = comm[:100], c.get("data")
        self.changed = True
        if msg_type == "comm_close":
            self.states.pop(comm, None)
            return
        state = data.get("state") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(state, dict):
            return
        if msg_type == "comm_open" and c.get("target_name") == "jupyter.widget":
            self.states.pop(comm, None)
            self.states[comm] = {}
            while len(self.states) > MAX_WIDGETS:
                self.states.pop(next(iter(self.states)))
        elif msg_type != "comm_msg" or data.get("method") != "update" or comm not in self.states:
            return
        kept = self.states[comm]
        for key, value in state.items():
            if key not in KEYS:
                continue
            try:
                value = clean.json_value(value)
            except clean.NotJSON:
                continue
            if key == "outputs":
                kept["outputs"] = self._bounded(value if isinstance(value, list) else [])
            elif clean.size(value) <= MAX_STATE_BYTES:
                kept[key] = value

    def capture(self, model_id: str, outputs: list[dict[str, Any]], cleared: bool) -> None:
        """What an Output widget captured in a call: its outputs after a clear, or more of them."""
        state = self.states.get(model_id)
        if state is None:
            return
        self.changed = True
        old = [] if cleared else list(state.get("outputs") or [])
        for o in outputs:
            last = old[-1] if old else None
            if (o.get("output_type") == "stream" and isinstance(last, dict) and last.get("output_type") == "stream"
                    and last.get("name") == o.get("name")):
                old[-1] = {**last, "text": str(last.get("text", "")) + str(o.get("text", ""))}
            else:
                old.append(o)
        state["outputs"] = self._bounded(old)

    def _bounded(self, outputs: list[Any]) -> list[dict[str, Any]]:
        """The last outputs that fit MAX_OUTPUTS and the byte budget of one widget's outputs."""
        kept: list[dict[str, Any]] = []
        room = self.max_output_bytes
        for o in reversed([o for o in outputs if isinstance(o, dict)][-MAX_OUTPUTS:]):
            room -= clean.size(o)
            if room < 0:
                break
            kept.append(o)
        return kept[::-1]


def tree(model_id: str, get: Callable[[str], State | None], depth: int = 0,
         seen: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """What widget `model_id` shows (see the module's doc); None when its state is unknown."""
    state = get(model_id)
    if state is None or model_id in seen or depth > MAX_DEPTH:
        return None
    name = state.get("_model_name")
    kind = name.removesuffix("Model") if isinstance(name, str) and name else "Widget"
    seen = seen | {model_id}
    if kind == "Output":
        return {"kind": kind, "outputs": with_trees(state.get("outputs") or [], get, depth + 1, seen)}
    if kind in CONTAINERS:
        children = [c[len(REF):] for c in state.get("children") or [] if isinstance(c, str) and c.startswith(REF)]
        shown = [tree(c, get, depth + 1, seen) or {"kind": "Widget", "text": ""} for c in children[:MAX_CHILDREN]]
        out: dict[str, Any] = {"kind": kind, "children": shown}
        titles = _titles(state)
        if any(titles):
            out["titles"] = titles[:len(shown)]
        return out
    return {"kind": kind, "text": _text(kind, state)}


def with_trees(outputs: list[Any], get: Callable[[str], State | None], depth: int = 0,
               seen: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Outputs with the tree of each widget among them (`widget`), as an Output widget shows them."""
    out = []
    for o in outputs:
        if not isinstance(o, dict):
            continue
        inner = model_of(o.get("data")) if o.get("output_type") in ("display_data", "execute_result") else None
        sub = tree(inner, get, depth, seen) if inner else None
        out.append({**o, "widget": sub} if sub else o)
    return out


def _titles(state: State) -> list[str]:
    titles = state.get("titles")
    if isinstance(titles, list):
        return [t[:MAX_TEXT] if isinstance(t, str) else "" for t in titles]
    old = state.get("_titles")  # ipywidgets 7: {"0": "title"}
    if isinstance(old, dict):
        n = max((int(k) + 1 for k in old if isinstance(k, str) and k.isdigit() and len(k) < 4), default=0)
        return [str(old.get(str(i), ""))[:MAX_TEXT] for i in range(n)]
    return []


def _text(kind: str, state: State) -> str:
    """One line: the widget's description and its value as a person reads it."""
    description = state.get("description")
    description = " ".join(description.split()) if isinstance(description, str) else ""
    value = _value(kind, state)
    if description and value:
        line = f"{description}{' ' if description.endswith(':') else ': '}{value}"
    else:
        line = description or value
    return line if len(line) <= MAX_TEXT else line[:MAX_TEXT - 1] + "…"


def _value(kind: str, state: State) -> str:
    labels, index = state.get("_options_labels"), state.get("index")
    if isinstance(labels, list):
        def label(i: Any) -> str:
            return str(labels[i]) if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(labels) else ""
        if isinstance(index, list):
            return (" – " if "Range" in kind else ", ").join(label(i) for i in index)
        return label(index)
    if kind == "Image":
        size = "x".join(str(state[k]) for k in ("width", "height") if state.get(k))
        return " ".join(p for p in (str(state.get("format") or ""), size) if p)
    if "value" not in state or kind == "Button":
        return ""
    value = state["value"]
    if kind == "Password" and isinstance(value, str):
        return "•" * len(value)
    if isinstance(value, str):
        if kind in ("HTML", "HTMLMath"):
            return " ".join(html_text(value).split())
        return value
    if isinstance(value, list) and "Range" in kind:
        return " – ".join(str(v) for v in value)
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value)
