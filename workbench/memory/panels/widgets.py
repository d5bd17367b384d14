"""A compact memory review for the notebook client, in plain ipywidgets.

`MemoryReview(source).widget` is a VBox: a status filter, the list, the
selected memory with its diff and provenance (a button per citation shows the
source events in context), and accept / reject / edit / merge buttons. Use
`RestSource()` as the source in a notebook whose server holds the database.

The HTML widgets get only what render.py escaped; titles, quotes and ids go into
text-only widgets (options, button labels and tooltips are set as text).
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from ...plugins.errors import WorkbenchError
from .render import CONTEXT, STATUS_OPTIONS, context_html, memory_html, message_html, proposal_diffs
from .source import MemorySource


class MemoryReview:
    """The ipywidgets review view over a MemorySource."""

    def __init__(self, source: MemorySource, actor: str = "person:reviewer", status: str = "proposed"):
        self.source, self.actor = source, actor
        self.status = w.Dropdown(options=STATUS_OPTIONS, value=status, description="status")
        self.memories = w.Select(options=[], rows=8, layout=w.Layout(width="100%"))
        self.memories.add_class("wb-memory-list")
        self.detail = w.HTML()
        self.citations = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self.citations.add_class("wb-citations")
        self.source_view = w.HTML()
        self.source_view.add_class("wb-source-view")
        self.text = w.Textarea(layout=w.Layout(width="100%", height="90px"))
        self.merge_with = w.SelectMultiple(options=[], rows=3, description="merge with")
        self.message = w.HTML()
        self.buttons = {name: w.Button(description=label, button_style=style) for name, label, style in [
            ("accept", "Accept", "success"), ("accept_edited", "Accept edited", "info"), ("edit", "Save edit", ""),
            ("reject", "Reject", "danger"), ("retire", "Retire", "warning"), ("merge", "Merge", "info")]}
        self.status.observe(lambda _c: self.refresh(), "value")
        self.memories.observe(lambda _c: self.show(), "value")
        for name, b in self.buttons.items():
            b.on_click(lambda _b, name=name: self.act(name))
        self.widget = w.VBox([
            w.HBox([self.status, self.message]), self.memories, self.detail, self.citations, self.source_view,
            self.text, w.HBox([self.buttons[n] for n in ("accept", "accept_edited", "edit", "reject", "retire")]),
            w.HBox([self.merge_with, self.buttons["merge"]]),
        ])
        self.refresh()

    def refresh(self) -> None:
        rows = self.source.list(status=None if self.status.value == "all" else self.status.value)
        keep = self.memories.value
        self.memories.options = [(f"[{m['status']}] {m['title']}", m["id"]) for m in rows]
        ids = [m["id"] for m in rows]
        self.memories.value = keep if keep in ids else (ids[0] if ids else None)
        self.merge_with.options = [(m["title"], m["id"]) for m in self.source.list() if m["status"] in ("proposed", "accepted")]
        self.show()

    def show(self) -> None:
        self.source_view.value = ""
        if self.memories.value is None:
            self.detail.value, self.citations.children, self.text.value = "<i>no memories match</i>", (), ""
            return
        m = self.source.get(self.memories.value)
        self.detail.value = memory_html(m) + proposal_diffs(m, self.source.get)
        buttons = []
        for c in m["provenance"]:
            b = w.Button(description=f"{c['session_id']} #{c['seq']}", tooltip=c.get("quote") or "")
            b.on_click(lambda _b, c=c: self.show_source(c))
            buttons.append(b)
        self.citations.children = tuple(buttons)
        self.text.value = m["text"]

    def show_source(self, c: dict[str, Any]) -> None:
        events = self.source.session_events(c["session_id"], after=max(0, c["seq"] - 1 - CONTEXT), until=c["seq"] + CONTEXT)
        self.source_view.value = context_html(events, c["seq"], c.get("quote"))

    def act(self, name: str) -> dict[str, Any] | None:
        mid = self.memories.value
        if mid is None:
            return None
        action = "accept" if name == "accept_edited" else name
        kw: dict[str, Any] = {}
        if name in ("accept_edited", "edit", "merge"):
            kw["text"] = self.text.value
        if name == "merge":
            kw["with"] = [i for i in self.merge_with.value if i != mid]
        try:
            m = self.source.review(mid, action, self.actor, **kw)
        except WorkbenchError as e:
            self.message.value = message_html(str(e), "danger")
            return None
        self.message.value = message_html(f"{action}: {m['id']} is now {m['status']}", "success")
        self.refresh()
        return m
