"""The memory review panel (Panel): proposals with provenance, diffs, accept / edit / reject / merge.

Use it inline in a notebook (`ReviewApp(source).panel()`, after
`pn.extension(inline=True)` so Panel's code comes inline, not from a CDN) or served by
`workbench review` on 127.0.0.1, behind a per-launch token. Every button is a
versioned change in the store, made as the reviewer named in the "reviewer" field.

Everything shown comes from sessions, kernels and dreams, so it is hostile:
HTML panes get only what render.py escaped (a memory's text: Markdown with raw
HTML escaped), and choices are plain-text widgets (Panel's MultiChoice renders
its labels as HTML, so it is not used).

A cited event shows in context here; over a server (`RestSource`) it is also a
link that opens the session at that event in JupyterLab's workbench sidebar.
A store opened in-process has no server to link to: the context view is all.
"""

from __future__ import annotations

import sys
import webbrowser
from collections.abc import Callable
from typing import Any

import panel as pn

from ...plugins.errors import WorkbenchError
from .gate import cookie_name, new_token, require_token
from .render import (
    CONTEXT,
    STATUS_OPTIONS,
    chain_html,
    conflicts_html,
    context_html,
    esc,
    history_html,
    memory_html,
    message_html,
    proposal_diffs,
    timeline_html,
    who,
)
from .source import MemorySource, RestSource


class ReviewApp:
    """A review panel over a MemorySource (the store in-process, or RestSource)."""

    def __init__(self, source: MemorySource, actor: str = "person:reviewer", status: str = "proposed",
                 session_url: Callable[[str, int], str] | None = None):
        self.source = source
        # where a cited event opens (JupyterLab, at that event): given, or the server a RestSource talks to
        self.session_url = session_url or (source.session_url if isinstance(source, RestSource) else None)
        self.reviewer = actor
        self.status = pn.widgets.Select(label="status", options=list(STATUS_OPTIONS), value=status, width=140)
        self.tag = pn.widgets.Select(label="tag", options=["all"], value="all", width=140)
        self.dream = pn.widgets.Select(label="dream", options={"all": ""}, value="", width=220)
        # who reviews is who runs the panel (or whom the server authenticates): shown, not chosen
        self.actor = pn.widgets.TextInput(label="reviewer", value=who(actor), width=200, disabled=True)
        self.memories = pn.widgets.Select(label="memories", options={}, size=14, width=420, css_classes=["wb-memories"])
        self.detail = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["wb-detail"])
        self.diff = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["wb-diff-pane"])
        self.provenance = pn.Column(css_classes=["wb-provenance"])
        self.source_pane = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["wb-source"])
        self.title_input = pn.widgets.TextInput(label="title", sizing_mode="stretch_width")
        self.text_input = pn.widgets.TextAreaInput(label="text", height=120, sizing_mode="stretch_width")
        self.note_input = pn.widgets.TextInput(label="note (why)", sizing_mode="stretch_width")
        self.accept_button = pn.widgets.Button(label="Accept", color="success")
        self.accept_edited_button = pn.widgets.Button(label="Accept with my edits", color="primary")
        self.save_button = pn.widgets.Button(label="Save edit", color="default")
        self.reject_button = pn.widgets.Button(label="Reject", color="danger")
        self.retire_button = pn.widgets.Button(label="Retire", color="warning")
        self.merge_with = pn.widgets.MultiSelect(label="merge with", options={}, size=4, sizing_mode="stretch_width")
        self.merge_button = pn.widgets.Button(label="Merge", color="primary")
        self.superseded_by = pn.widgets.Select(label="superseded by (a newer, accepted memory)", options={}, sizing_mode="stretch_width")
        self.supersede_button = pn.widgets.Button(label="Supersede", color="warning")
        self.message = pn.pane.HTML("", visible=False, sizing_mode="stretch_width", css_classes=["wb-message"])
        self.message_kind = ""
        self.timeline_dream = pn.widgets.Select(label="dream", options={}, width=320)
        self.timeline = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["wb-timeline-pane"])

        for w in (self.status, self.tag, self.dream):
            w.param.watch(lambda _e: self.refresh(), "value")
        self.memories.param.watch(lambda _e: self.show(), "value")
        self.timeline_dream.param.watch(lambda _e: self.show_timeline(), "value")
        for button, action, edited in ((self.accept_button, "accept", False), (self.accept_edited_button, "accept", True),
                                       (self.save_button, "edit", True), (self.reject_button, "reject", False),
                                       (self.retire_button, "retire", False), (self.merge_button, "merge", True),
                                       (self.supersede_button, "supersede", False)):
            self._on_click(button, action, edited)
        self.refresh()

    def _on_click(self, button: pn.widgets.Button, action: str, edited: bool) -> None:
        def click(_e: Any) -> None:  # act's result is for callers; Panel expects None or an awaitable to run
            self.act(action, edited=edited)

        button.on_click(click)

    # -- state ------------------------------------------------------------------

    @property
    def selected(self) -> str | None:
        return self.memories.value or None

    def refresh(self) -> None:
        """Reload the filters' choices and the list of memories."""
        everything = self.source.list()
        tags = sorted({t for m in everything for t in m["tags"]})
        self.tag.options = ["all", *tags]
        dreams = self.source.dreams()
        self.dream.options = {"all": "", **{f"{d['id']} · {d['created_at'][:16]} · {d['proposals']} proposed": d["id"] for d in dreams}}
        self.timeline_dream.options = {f"{d['id']} · {d['title']}": d["id"] for d in dreams}
        if dreams and self.timeline_dream.value not in self.timeline_dream.options.values():
            self.timeline_dream.value = dreams[-1]["id"]  # the latest dream
        rows = self.source.list(status=None if self.status.value == "all" else self.status.value,
                                tag=None if self.tag.value == "all" else self.tag.value, dream=self.dream.value or None)
        keep = self.selected
        self.memories.options = {f"[{m['status']}] {m['title']} ({m['id']})": m["id"] for m in rows}
        self.memories.value = keep if keep in self.memories.options.values() else (rows[0]["id"] if rows else None)
        self.merge_with.options = {f"{m['title']} ({m['id']})": m["id"] for m in everything if m["status"] in ("proposed", "accepted")}
        self.superseded_by.options = {"": "", **{f"{m['title']} ({m['id']})": m["id"] for m in everything if m["status"] == "accepted"}}
        self.show()
        self.show_timeline()

    def show(self) -> None:
        """Show the selected memory: text, diff, provenance buttons, edit fields."""
        self.source_pane.object = ""
        mid = self.selected
        if mid is None:
            self.detail.object = "<i>no memories match these filters</i>"
            self.diff.object, self.provenance.objects = "", []
            return
        m = self.source.get(mid)
        self.detail.object = memory_html(m) + chain_html(m) + conflicts_html(m) + history_html(m)
        self.diff.object = proposal_diffs(m, self.source.get)
        buttons: list[pn.viewable.Viewable] = []
        for c in m["provenance"]:
            b = pn.widgets.Button(label=f"{c['session_id']} #{c['seq']}", color="light", css_classes=["wb-cite"])

            def cite(_e: Any, c: dict[str, Any] = c) -> None:
                self.show_source(c)

            b.on_click(cite)
            quote = f"“{esc(c['quote'])}”" if c.get("quote") else ""
            link = (f'<a class="wb-open-session" href="{esc(self.session_url(c["session_id"], c["seq"]))}" target="_blank" '
                    f'rel="noopener">open the session at #{esc(c["seq"])}</a> ' if self.session_url else "")
            buttons.append(pn.Row(b, pn.pane.HTML(f"{link}<small>{quote}</small>", css_classes=["wb-cite-quote"])))
        self.provenance.objects = buttons or [pn.pane.HTML("<i>no provenance (written by a person)</i>")]
        self.title_input.value, self.text_input.value = m["title"], m["text"]
        self.merge_with.value = []

    def show_source(self, citation: dict[str, Any]) -> None:
        """The cited event in context: a few events before and after it."""
        seq = citation["seq"]
        try:
            events = self.source.session_events(citation["session_id"], after=max(0, seq - 1 - CONTEXT), until=seq + CONTEXT)
        except WorkbenchError as e:
            self.source_pane.object = f"<b>cannot read session {esc(citation['session_id'])}: {esc(e)}</b>"
            return
        self.source_pane.object = (f"<h4>session {esc(citation['session_id'])}, around #{esc(seq)}</h4>"
                                   + context_html(events, seq, citation.get("quote")))

    def show_timeline(self) -> None:
        did = self.timeline_dream.value
        self.timeline.object = timeline_html(self.source.session_events(did)) if did else "<i>no dreams yet</i>"

    def act(self, action: str, edited: bool = False) -> dict[str, Any] | None:
        """Apply a review action to the selected memory as the reviewer; the message says what happened."""
        mid = self.selected
        if mid is None:
            self._say("select a memory first", "warning")
            return None
        kw: dict[str, Any] = {}
        note = (self.note_input.value or "").strip() or None
        if edited:
            kw.update(title=self.title_input.value, text=self.text_input.value)
        if action == "merge":
            kw["with"] = [i for i in self.merge_with.value if i != mid]
        if action == "supersede":
            kw["by"] = self.superseded_by.value or None
        if action in ("accept", "reject", "retire", "edit", "merge", "supersede") and note:
            kw["note"] = note
        try:
            m = self.source.review(mid, action, self.reviewer.strip(), **kw)
        except WorkbenchError as e:
            self._say(str(e), "danger")
            return None
        self.note_input.value = ""
        self._say(f"{action}: {m['id']} is now {m['status']} (v{m['version']})", "success")
        self.refresh()
        return m

    def _say(self, text: str, kind: str) -> None:
        self.message.object, self.message_kind, self.message.visible = message_html(text, kind), kind, True

    # -- layout -------------------------------------------------------------------

    def panel(self) -> pn.viewable.Viewable:
        """The whole app: a review tab and a dream-timeline tab."""
        filters = pn.Row(self.status, self.tag, self.dream, self.actor)
        actions = pn.Column(
            pn.Row(self.accept_button, self.reject_button, self.retire_button),
            self.title_input, self.text_input, self.note_input,
            pn.Row(self.save_button, self.accept_edited_button),
            pn.Row(self.merge_with, self.merge_button),
            pn.Row(self.superseded_by, self.supersede_button),
        )
        review = pn.Column(filters, self.message, pn.Row(
            pn.Column(self.memories, width=440),
            pn.Column(self.detail, self.diff, pn.pane.HTML("<b>provenance</b> (click to see the source events)"),
                      self.provenance, self.source_pane, actions, sizing_mode="stretch_width"),
            sizing_mode="stretch_width"))
        timeline = pn.Column(self.timeline_dream, self.timeline, sizing_mode="stretch_width")
        return pn.Tabs(("Review", review), ("Dream timeline", timeline), sizing_mode="stretch_width")


def review_url(port: int, token: str) -> str:
    """The URL of a served review app, with the token that opens it."""
    return f"http://127.0.0.1:{port}/review?token={token}"


def serve_review(source: MemorySource, *, port: int = 5006, show: bool = False, actor: str = "person:reviewer",
                 token: str | None = None, announce: bool = True) -> Any:
    """Serve the review app on 127.0.0.1 behind a token (new each launch unless given); blocks until stopped."""
    token = token or new_token()
    origins = [f"127.0.0.1:{port}", f"localhost:{port}"]
    # Cookies and headers stay out of Bokeh's session token, which the page can read: other
    # servers on this host (Jupyter's login cookie, say) send theirs here too.
    server = pn.serve({"review": lambda: ReviewApp(source, actor=actor).panel()}, port=port, address="127.0.0.1",
                      websocket_origin=origins, show=False, start=False, verbose=False, title="workbench memory review",
                      include_cookies=[], include_headers=[])
    # Bokeh's Server does not expose its Tornado application; the gate must sit in front of all of it.
    require_token(server._tornado, token, cookie_name(port))
    url = review_url(port, token)
    if announce:
        print(f"memory review: open {url} (the token is new at every launch)", file=sys.stderr, flush=True)
    if show:
        webbrowser.open(url)
    server.start()
    server.io_loop.start()
    return server
