"""The conversation, live in a cell's output, with ipywidgets.

A ChatView is fed the stream messages of a session (`feed`) and shows the answer: text streams in as it is
generated and is then rendered as Markdown (code highlighted, $math$ typeset); thinking sits collapsed; each
tool call is a fold titled by what it ran and how it ended, open while it runs (its live output) and closed once
its result is in, with the images it made shown below it, outside the fold. The prompt is not repeated (it is
the cell), and a turn that ended normally leaves no status line: only problems (an error, an interruption, a
kernel that died) are said. `transcript()` is the same conversation as plain text, the fallback for frontends
without widgets (and for headless runs: nbclient keeps it).
"""

from __future__ import annotations

import base64
import html
from types import MappingProxyType
from typing import Any

from ..markdown import markdown_html
from ..render import one_line, result_blocks

LIVE_CHARS = 20_000  # the latest characters of a running call's live output a view shows
IMAGE_TYPES = MappingProxyType({"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"})
PRE = "white-space: pre-wrap; font-family: var(--jp-code-font-family, monospace); font-size: 12px; margin: 0"
QUIET = "color: var(--jp-ui-font-color2, gray); font-size: var(--jp-ui-font-size0, 11px)"
CODE = ("overflow-x: auto; white-space: pre; font-family: var(--jp-code-font-family, monospace); font-size: 12px; "
        "margin: 0; padding: 4px; background: var(--jp-cell-editor-background, #f7f7f7)")


def _pre(text: str, color: str | None = None) -> str:
    style = PRE + (f"; color: {color}" if color else "")
    return f'<pre style="{style}">{html.escape(text)}</pre>'


def _text_html(text: str, lead: str = "") -> str:
    """Text as written, its lines kept (a widget's HTML has a line height of a whole control: reset it)."""
    return f'<div style="white-space: pre-wrap; line-height: 1.4">{lead}{html.escape(text)}</div>'


def _answer_html(text: str) -> str:
    """An answer's Markdown as HTML: raw HTML shown as text, fenced code highlighted, $math$ left for the typesetter."""
    return f'<div class="jp-wb-answer" style="line-height: 1.4">{markdown_html(text, math=True)}</div>'


def _code_html(code: str, lang: str = "python") -> str:
    """A call's code, highlighted, scrolling sideways rather than wrapping."""
    html_ = markdown_html(f"```{lang}\n{code}\n```").replace("<pre>", f'<pre style="{CODE}">', 1)
    return html_ if "<pre" in html_ else _pre(code)


def _call_title(name: str, inp: Any, code: str | None, state: str) -> str:
    """What a call's fold says when closed: the tool, the first line it ran, how it ended."""
    what = one_line(code.strip().splitlines()[0] if code and code.strip() else str(inp), 60)
    return f"{name}: {what} · {state}"


def _image(w: Any, data: bytes, fmt: str) -> Any:
    """An image at its natural size, at most the cell's width: a VBox stretches its children to its
    width (a plot drawn larger than it was made, and blurred) unless a child aligns to the start."""
    return w.Image(value=data, format=fmt,
                   layout=w.Layout(width="auto", height="auto", max_width="100%", align_self="flex-start",
                                   object_fit="contain"))


class ChatView:
    """Widgets showing one session's turn as it happens."""

    def __init__(self, session_id: str, prompt: str | None = None):
        import ipywidgets as w

        self.w = w
        self.session_id = session_id
        self.header = w.HTML(f'<span style="{QUIET}">agent · session <code>{html.escape(session_id)}</code></span>')
        self.body = w.VBox([])
        self.live = w.VBox([])  # the response being streamed; replaced by the stored turn
        self.status = w.HTML("")
        self.box = w.VBox([self.header, self.body, self.live, self.status])
        self._stream_block: Any = None
        self._stream_text = ""
        self._calls: dict[str, Any] = {}  # tool_use_id -> the box of its text output, inside its fold
        self._shown: dict[str, Any] = {}  # tool_use_id -> the box of its images, below its fold
        self._folds: dict[str, tuple[Any, str, Any, str | None]] = {}  # tool_use_id -> (fold, name, input, code)
        self._live: dict[str, dict[str, Any]] = {}  # tool_use_id -> {"text", "pre", "line"}: its output as it runs
        self.lines: list[str] = []  # the plain-text transcript
        self.hands_line = ""
        self.prompt = prompt  # the cell that holds it shows it: not repeated in the view (the transcript has it)

    # -- feeding -------------------------------------------------------------------

    def feed(self, msg: dict[str, Any]) -> None:
        """One stream message: {"kind": "delta"|"event", "event": ...} or {"kind": "output", ...} (docs/api.md)."""
        if msg.get("kind") == "delta":
            self.delta(msg["event"])
        elif msg.get("kind") == "event":
            self.event(msg["event"])
        elif msg.get("kind") == "output":
            self.output(msg)

    def output(self, m: dict[str, Any]) -> None:
        """A running call's live output: its latest lines in the call's box, with the elapsed time and the hands' state.
        Not in the transcript: the committed result replaces it."""
        out = self._calls.get(m.get("tool_use_id", ""))
        if out is None:
            return
        w = self.w
        live = self._live.get(m["tool_use_id"])
        if live is None:
            live = self._live[m["tool_use_id"]] = {"text": "", "pre": w.HTML(""), "line": w.HTML("")}
            out.children = (live["line"], live["pre"])
        text = live["text"] if not m.get("snapshot") else ""
        if m.get("skipped"):
            text += f"[… {m['skipped']:,} characters not shown live …]\n"
        text = (text + str(m.get("text") or ""))[-LIVE_CHARS:]
        if text != live["text"]:
            live["text"] = text
            live["pre"].value = _pre(text)
        state = "running" if m.get("state") == "running" else "finishing"
        if (folded := self._folds.get(m["tool_use_id"])) is not None:
            fold, name, inp, code = folded
            fold.set_title(0, _call_title(name, inp, code, f"{state} {float(m.get('elapsed_s') or 0):.0f} s"))
        live["line"].value = (f'<span style="color: gray">{state} · {float(m.get("elapsed_s") or 0):.0f} s · '
                              f'hands {html.escape(str(m.get("hands")))}</span>')

    def delta(self, ev: dict[str, Any]) -> None:
        w = self.w
        t = ev.get("type")
        if t == "content_block_start":
            kind = ev.get("content_block", {}).get("type")
            self._stream_text = ""
            if kind == "text":
                self._stream_block = w.HTML("")  # as written while it streams: Markdown once the turn is stored
                self.live.children = (*self.live.children, self._stream_block)
            elif kind == "thinking":
                self._stream_block = w.HTML("")
                acc = w.Accordion(children=[self._stream_block], selected_index=None)
                acc.set_title(0, "thinking…")
                self.live.children = (*self.live.children, acc)
            else:
                self._stream_block = None
        elif t == "content_block_delta" and self._stream_block is not None:
            d = ev.get("delta", {})
            piece = d.get("text") if d.get("type") == "text_delta" else d.get("thinking") if d.get("type") == "thinking_delta" else None
            if piece:
                self._stream_text += piece
                self._stream_block.value = _text_html(self._stream_text)
        elif t == "content_block_stop":
            self._stream_block = None

    def event(self, ev: dict[str, Any]) -> None:
        p, t = ev["payload"], ev["type"]
        if t == "user_message":
            self.lines.append(f"you: {p['text']}")
        elif t == "assistant_turn":
            self.live.children = ()
            for block in p["message"].get("content", []):
                self._block(block)
        elif t == "tool_result":
            self._result(p)
        elif t in ("hands_started", "hands_died", "hands_restarted", "hands_timeout", "hands_stopped", "hands_refused"):
            self.hands_line = _hands_note(t, p)
            self.status.value = f'<span style="{QUIET}">hands: {html.escape(self.hands_line)}</span>'
            if t in ("hands_died", "hands_timeout", "hands_refused"):
                self._note(f"[{t}] {self.hands_line}", "#b36b00")
        elif t in ("model_retry", "model_error"):
            self._note(f"[{t}] {p.get('error', '')}", "#b00020" if t == "model_error" else "#b36b00")
        elif t == "interrupted":
            self._note(f"[interrupted by {p.get('by', 'user')}]", "#b36b00")
        elif t == "resumed":
            self._note("[resumed from the log after the server restarted]", "gray")
        elif t == "turn_ended":
            stop = p.get("stop_reason")
            self.live.children = ()
            if stop != "end_turn":
                self._note(f"[turn ended: {stop}]", "#b00020")
            self.status.value = ""  # the answer is above; a normal end needs no line, a problem was said where it was

    # -- pieces --------------------------------------------------------------------

    def _add(self, widget: Any) -> None:
        self.body.children = (*self.body.children, widget)

    def _note(self, text: str, color: str) -> None:
        self._add(self.w.HTML(f'<span style="color: {color}">{html.escape(text)}</span>'))
        self.lines.append(text)

    def _block(self, block: dict[str, Any]) -> None:
        w, kind = self.w, block.get("type")
        if kind == "text":
            self._add(w.HTMLMath(_answer_html(block["text"])))
            self.lines.append(f"agent: {block['text']}")
        elif kind == "thinking" and block.get("thinking"):
            acc = w.Accordion(children=[w.HTML(_text_html(block["thinking"]))], selected_index=None)
            acc.set_title(0, "thinking")
            self._add(acc)
        elif kind == "tool_use":
            name, inp = str(block.get("name")), block.get("input") or {}
            code = inp.get("code") if name == "python" and isinstance(inp.get("code"), str) else None
            src = w.HTML(_code_html(code) if code is not None else _pre(str(inp)))
            out = w.VBox([w.HTML(f'<span style="{QUIET}">running…</span>')])
            fold = w.Accordion(children=[w.VBox([src, out])], selected_index=0,  # open while it runs
                               layout=w.Layout(margin="4px 0"))
            fold.set_title(0, _call_title(name, inp, code, "running"))
            shown = w.VBox([])
            self._calls[block["id"]], self._shown[block["id"]] = out, shown
            self._folds[block["id"]] = (fold, name, inp, code)
            self._add(fold)
            self._add(shown)
            self.lines.append(f"[{name}]\n{code if code is not None else inp}")

    def _result(self, p: dict[str, Any]) -> None:
        w = self.w
        parts: list[Any] = []
        images: list[Any] = []
        texts = []
        for b in result_blocks(p):
            if b.get("type") == "text":
                texts.append(b["text"])
                parts.append(w.HTML(_pre(b["text"], "#b00020" if p.get("is_error") else None)))
            elif b.get("type") == "image":
                src = b.get("source", {})
                fmt = IMAGE_TYPES.get(src.get("media_type", ""), "png")
                images.append(_image(w, base64.b64decode(src.get("data", "")), fmt))
        tid = p.get("tool_use_id", "")
        out, shown = self._calls.get(tid), self._shown.get(tid)
        self._live.pop(tid, None)
        if out is not None and shown is not None:
            out.children = tuple(parts) or (w.HTML(f'<span style="{QUIET}">no output</span>'),)
            shown.children = tuple(images)
            fold, name, inp, code = self._folds[tid]
            state = "error" if p.get("is_error") else f"{len(images)} image(s)" if images else "done"
            fold.set_title(0, _call_title(name, inp, code, state))
            fold.selected_index = None  # closed once its result is in: the answer is what the cell is for
        else:
            for part in (*parts, *images):
                self._add(part)
        self.lines.append(("[error] " if p.get("is_error") else "[output] ") + "\n".join(texts))

    # -- display -------------------------------------------------------------------

    def transcript(self) -> str:
        return "\n".join(self.lines)

    def _repr_mimebundle_(self, **kw: Any) -> dict[str, Any]:
        bundle = self.box._repr_mimebundle_(**kw) or {}
        bundle = dict(bundle)
        bundle["text/plain"] = self.transcript() or f"agent session {self.session_id}"
        return bundle


def _hands_note(t: str, p: dict[str, Any]) -> str:
    gen = p.get("generation")
    if t == "hands_started":
        return f"kernel generation {gen} ready (pid {p.get('pid')}, {p.get('start_ms', 0):.0f} ms)"
    if t == "hands_died":
        return f"kernel generation {gen} died ({p.get('how', '')}); the next call gets a fresh one"
    if t == "hands_timeout":
        return f"a call ran past {p.get('timeout')} s ({p.get('action')})"
    if t == "hands_restarted":
        return f"restarted (generation {gen})"
    if t == "hands_refused":
        return str(p.get("reason") or p.get("error") or "refused: no safe sandbox")
    return "stopped"
