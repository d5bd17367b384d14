"""Turning one execution's Jupyter messages into an Observation, with caps, whatever the kernel sends.

Shared by every backend that speaks the Jupyter message protocol (local
kernels over ZMQ, gateway kernels over a websocket), so that they report
output, errors, displays and truncation in exactly the same way.

A message's content comes from kernel code and is checked here, field by field: a field of the
wrong type, a display bundle that is not an object of strings (or JSON, for JSON types), an
image that is not one, a lone surrogate, a number the log cannot store: each is dropped (or
repaired, for surrogates) with a note the model reads, and never raises. What is kept stays
within the session's budget (`Budget`): `output_limit` characters per stream and per text part
of a display, `max_displays` displays, images of at most `max_image_bytes` (bigger ones are
downscaled), and `max_observation_bytes` for everything together, as the log would store it.
What the model reads of it is bounded again when it is rendered (render.blocks): `output_limit`
characters of text in all and `max_images` images.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import clean, images
from .fold import ELSEWHERE, Fold, Other, Rich, Stream, output
from .kernel_cap import DROPPED_MIME
from .live import OutputSink, forward
from .observation import Observation, text_by_kind
from .widgets import VIEW, Widgets, model_of, tree, with_trees

MAX_NOTES = 12  # notes about dropped or repaired output per call; then one that says there were more
MAX_MIME_CHARS = 255  # the longest MIME type name kept
MAX_TRACEBACK = 50  # lines of a traceback kept, the last ones
MAX_SHOWN = 10_000  # display ids a kernel's calls left shown that are remembered, the last ones
MAX_VIEWS = 200  # widgets shown by earlier calls that are watched for changes, the last ones


@dataclass(frozen=True)
class Budget:
    """What one call's observation may hold (from the session's HandsConfig)."""

    output_limit: int = 20_000  # characters per stream, result and text part of a display; and what the model reads in all
    max_displays: int = 20
    max_bytes: int = 4 * 1024 * 1024  # the whole observation, as compact UTF-8 JSON
    max_image_bytes: int = 1024 * 1024  # one image, decoded
    max_images: int = 20  # images the model is shown


@dataclass
class Notebook:
    """What a kernel's calls left in the notebook, which a later call may change: the display ids still shown,
    the widgets (their state) and those shown, each with the call that showed it (0: a call replayed)."""

    calls: int = 0
    displays: dict[str, int] = field(default_factory=dict)  # display id: the call that showed it
    widgets: Widgets = field(default_factory=Widgets)
    views: dict[str, tuple[int, str]] = field(default_factory=dict)  # a widget shown: its call, a digest of its tree

    def replayed(self) -> None:
        """The calls so far were replayed (not the model's): what they showed is from an earlier call."""
        self.displays = dict.fromkeys(self.displays, 0)
        self.views = {k: (0, v) for k, (_, v) in self.views.items()}


class Collector:
    """Folds the iopub messages of one execute request (and its reply's payloads) into an Observation."""

    def __init__(self, budget: Budget, generation: int, notebook: Notebook | None = None,
                 on_output: OutputSink | None = None):
        """`notebook`: what earlier calls of this kernel left shown (display ids, widgets); updated by done().
        `on_output` hears each message's output as it comes (live.py), before it is folded."""
        self.budget = b = budget
        self.on_output = on_output
        self.notebook = notebook if notebook is not None else Notebook()
        self.notebook.calls += 1
        self.call = self.notebook.calls
        self.displayed: set[str] = set()  # display ids this call showed
        self.limit = b.output_limit
        self.fold = Fold(b.output_limit, b.max_displays, b.max_bytes)
        self.obs = Observation(generation=generation)
        self.notes: list[str] = []
        self._more_notes = 0
        self.exiting = False  # the reply asked the kernel to exit (`exit()`): it ends in a moment

    def note(self, text: str) -> None:
        """A note for the model about output that was dropped, cut or repaired (a few per call, then a count)."""
        if text in self.notes:
            return
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self._more_notes += 1

    async def feed(self, msg_type: str, c: dict[str, Any]) -> bool:
        """Take one message of this execution; True when the kernel is idle again (done)."""
        forward(self.on_output, msg_type, c)
        if msg_type == "stream":
            text = c.get("text")
            if isinstance(text, str):
                self.fold.stream("stdout" if c.get("name") == "stdout" else "stderr", clean.text(text))
            else:
                self.note("[a stream message without text from the kernel was dropped]")
        elif msg_type == "execute_result":
            data = c.get("data")
            if isinstance(data, dict) and DROPPED_MIME not in data:
                count = c.get("execution_count")
                extra = {"execution_count": count} if isinstance(count, int) and 0 <= count < 2**53 else {}
                await self._rich("execute_result", data, self._display_id(c), extra)
            else:
                self.note("[a malformed execute_result from the kernel was dropped: its data is not a MIME bundle]")
        elif msg_type in ("display_data", "update_display_data"):
            await self._display(msg_type, c)
        elif msg_type == "clear_output":
            self.fold.clear(c.get("wait") is True)
        elif msg_type == "error":
            err = self._error(c)
            if self.fold.owner is None:  # an error an Output widget captured is its output, not the call's failure
                self.obs.error = err
            self.fold.other({"output_type": "error", **err})
        elif msg_type in ("comm_open", "comm_msg", "comm_close"):
            self.notebook.widgets.comm(msg_type, c)
            if msg_type == "comm_msg":
                self._comm(c)
        elif msg_type == "status" and c.get("execution_state") == "idle":
            return True
        return False

    def interrupted_outside_the_code(self) -> None:
        """An interrupt reached the kernel outside the cell's code, while IPython prepared the cell or wrapped it up:
        ipykernel then sends no error and no reply (it logs the KeyboardInterrupt and goes idle), yet the call was
        interrupted, and says so as any interrupted call does."""
        err = {"ename": "KeyboardInterrupt",
               "evalue": "the interrupt reached the kernel outside the cell's code (as the cell was being prepared, or "
                         "wrapped up after it ran): what the outputs show is all the cell did",
               "traceback": []}
        self.obs.error = err
        self.fold.other({"output_type": "error", **err})

    def _comm(self, c: dict[str, Any]) -> None:
        """An Output widget's `msg_id` set (it captures what this call writes) or emptied (it stops)."""
        data = c.get("data")
        state = data.get("state") if isinstance(data, dict) and data.get("method") == "update" else None
        comm = c.get("comm_id")
        if isinstance(state, dict) and isinstance(state.get("msg_id"), str) and isinstance(comm, str):
            self.fold.capture(comm[:100], bool(state["msg_id"]))

    async def reply(self, content: dict[str, Any]) -> None:
        """The execute reply's payloads, as a notebook shows them: the pager's text (`len?`) as a display,
        the next input a kernel proposes (`%recall`, `%load`) as text."""
        payloads = content.get("payload")
        if not isinstance(payloads, list):
            return
        for p in payloads[:MAX_NOTES]:
            if not isinstance(p, dict):
                continue
            if p.get("source") == "page" and isinstance(p.get("data"), dict):
                await self._rich("display_data", p["data"], None, {"source": "page"})
            elif p.get("source") == "ask_exit" and not p.get("keepkernel"):
                self.exiting = True
            elif p.get("source") == "set_next_input" and isinstance(p.get("text"), str):
                self.fold.other({"output_type": "set_next_input", "text": self._cut(p["text"], "the proposed next input")})

    async def _display(self, msg_type: str, c: dict[str, Any]) -> None:
        data = c.get("data")
        if not isinstance(data, dict):
            self.note("[a display was dropped: its data is not a MIME bundle (an object of MIME types)]")
            return
        if DROPPED_MIME in data:  # the in-kernel cap tells how much it kept back
            self._kernel_dropped(data[DROPPED_MIME])
            return
        display_id = self._display_id(c)
        if msg_type == "update_display_data":
            if display_id is None:
                return  # a notebook shows an update without an id nowhere
            bundle, extra = await self._checked(data, "display")
            if self.fold.update(display_id, bundle, extra):
                return
            shown = self.notebook.displays.get(display_id)
            if shown is None:
                return  # its display was cleared, or never shown by this kernel: a notebook shows it nowhere
            # of a display an earlier call showed: read here as an update of it, saying which
            extra.update(updated=True, **({"calls_ago": self.call - shown} if shown else {}))
            self.fold.rich("display_data", bundle, display_id, extra)
            return
        await self._rich("display_data", data, display_id, {})

    def _display_id(self, c: dict[str, Any]) -> str | None:
        transient = c.get("transient")
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        return clean.text(display_id[:200]) if isinstance(display_id, str) else None

    async def _rich(self, output_type: str, data: dict[str, Any], display_id: str | None, extra: dict[str, Any]) -> None:
        if display_id is not None:
            self.displayed.add(display_id)
        if sum(1 for o in self.fold.items if getattr(o, "output_type", None) == output_type) >= self.budget.max_displays:
            self.fold.over_count[output_type] = self.fold.over_count.get(output_type, 0) + 1  # unread: over max_displays
            return
        bundle, more = await self._checked(data, "result" if output_type == "execute_result" else "display")
        if bundle:
            self.fold.rich(output_type, bundle, display_id, {**extra, **more})

    async def _checked(self, data: dict[str, Any], what: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The bundle of a display or result (`what`) as kept (see _bundle), and an SVG in it rendered as PNG for
        the model (`svg_png`)."""
        bundle = await self._bundle(data, what)
        extra: dict[str, Any] = {}
        svg = bundle.get("image/svg+xml")
        if isinstance(svg, str) and not any(m in bundle for m in images.IMAGE_TYPES):
            png, note = await asyncio.to_thread(images.svg_png, svg, self.budget.max_image_bytes)
            if note:
                self.note(note)
            if png is not None:
                extra["svg_png"] = png
        return bundle, extra

    def _kernel_dropped(self, counts: Any) -> None:
        ok = isinstance(counts, dict)
        tails = counts.get("tail") if ok else None
        for name in ("stdout", "stderr"):
            n = counts.get(name, 0) if ok else None
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**53:
                tail = tails.get(name) if isinstance(tails, dict) else None
                if isinstance(tail, str) and tail:  # first: the cut belongs to the output the tail lands in
                    self.fold.stream(name, clean.text(tail[-(2 * self.fold.tail_room + 2):]))
                self.fold.cut(name, n)
            else:
                ok = False
        if not ok:
            self.note("[a malformed note of dropped output from the kernel was ignored]")

    async def _bundle(self, data: dict[str, Any], what: str) -> dict[str, Any]:
        """A display bundle as kept: text cut to output_limit, JSON checked, images fitted; notes for the rest."""
        out: dict[str, Any] = {}
        for mime, value in data.items():
            if not isinstance(mime, str) or len(mime) > MAX_MIME_CHARS:
                self.note("[a part of a display with a malformed MIME type was dropped]")
                continue
            mime = clean.text(mime)
            if mime.startswith("image/") and not mime.startswith("image/svg"):
                if not isinstance(value, str):
                    self.note(f"[an {mime} display was dropped: its data is not a string]")
                    continue
                fitted = await asyncio.to_thread(images.fit, mime, value, self.budget.max_image_bytes)
                if fitted.note:
                    self.note(fitted.note)
                if fitted.data is not None:
                    out[mime] = fitted.data
            elif isinstance(value, str) and mime == "image/svg+xml":  # an image: whole or not at all
                if len(value) <= self.budget.max_image_bytes:
                    out[mime] = clean.text(value)
                else:
                    self.note(f"[an image/svg+xml display of {len(value):,} characters was dropped: over "
                              f"max_image_bytes ({self.budget.max_image_bytes:,})]")
            elif isinstance(value, str):
                if len(value) > self.limit:  # reported as a stream's cut is
                    self.note(f"[the {mime} of a {what} truncated: showed its first {self.limit:,} of {len(value):,} "
                              "characters (output_limit); write large output to a file and read parts of it]")
                out[mime] = clean.cut(clean.text(value[: self.limit + 1]), self.limit, mime)
            elif mime == "application/json" or mime.endswith("+json"):
                try:
                    value = clean.json_value(value)
                except clean.NotJSON as e:
                    self.note(f"[the {mime} part of a display was dropped: it holds {e}]")
                    continue
                if (n := clean.size(value)) > self.limit:
                    self.note(f"[the {mime} part of a display was dropped: {n:,} bytes of JSON, over output_limit "
                              f"({self.limit:,})]")
                    continue
                out[mime] = value
            else:
                self.note(f"[the {mime} part of a display was dropped: a {type(value).__name__}, not text]")
        return out

    def _error(self, c: dict[str, Any]) -> dict[str, Any]:
        """An error message's fields, checked and bounded: the last 50 traceback lines, each cut to `limit`."""
        ename, evalue, tb = c.get("ename"), c.get("evalue"), c.get("traceback")
        if not (isinstance(ename, str) and isinstance(evalue, str) and isinstance(tb, list)
                and all(isinstance(line, str) for line in tb)):
            self.note("[the kernel's error message was malformed: what could be read of it is shown]")
        lines = [line for line in tb if isinstance(line, str)] if isinstance(tb, list) else []
        if len(lines) > MAX_TRACEBACK:
            self.note(f"[the traceback truncated: showed its last {MAX_TRACEBACK} of {len(lines):,} lines]")
            lines = lines[-MAX_TRACEBACK:]
        return {"ename": clean.text(ename[:200]) if isinstance(ename, str) else "Error",
                "evalue": self._cut(evalue, "the error's value") if isinstance(evalue, str) else "",
                "traceback": [self._cut(line, "a line of the traceback") for line in lines]}

    def _cut(self, s: str, what: str) -> str:
        if len(s) <= self.limit:
            return clean.text(s)
        self.note(f"[{what} truncated: showed its first {self.limit:,} of {len(s):,} characters (output_limit)]")
        return clean.text(s[: self.limit]) + " [... cut]"

    def done(self) -> Observation:
        """The observation so far, within max_observation_bytes, with its notes."""
        obs, f, b = self.obs, self.fold, self.budget
        self._widgets()
        self._fit()
        # what a later call's update may reach: displays kept, or dropped over a budget (a notebook shows them),
        # not those this call cleared
        own = {i.display_id for i in f.items if isinstance(i, Rich) and i.display_id and i.owner != ELSEWHERE}
        displays = self.notebook.displays
        for display_id in own | (self.displayed - f.cleared_ids - {i.display_id for i in f.items if isinstance(i, Rich)
                                                                     and i.owner == ELSEWHERE}):
            displays.pop(display_id, None)
            displays[display_id] = self.call
        while len(displays) > MAX_SHOWN:
            displays.pop(next(iter(displays)))
        obs.outputs = f.outputs()
        obs.stdout, obs.stderr, obs.result = text_by_kind(obs.outputs)
        notes = f.notes()
        for kind, n in f.over_count.items():
            what = "display(s)" if kind == "display_data" else "result(s)"
            notes.append(f"[{n:,} more {what} were dropped: a call keeps at most {b.max_displays} (max_displays); "
                         "save figures to files, or combine them]")
        if f.over_bytes:
            notes.append(f"[{f.over_bytes:,} display(s) were dropped: with them the output would have been over "
                         f"{b.max_bytes:,} bytes (max_observation_bytes)]")
        notes += self.notes
        if self._more_notes:
            notes.append(f"[and {self._more_notes:,} more notes like these]")
        obs.truncated = notes
        obs.text_limit, obs.max_images = b.output_limit, b.max_images
        return obs

    def _widgets(self) -> None:
        """Widgets as they show: what each Output widget captured is its own (kept in the notebook's widgets, and
        read where the widget is shown); each widget this call shows gets its tree; a widget an earlier call showed
        that changed is read as an update of it: an Output widget's captures where they were written, any other
        change after the call's outputs."""
        f, nb = self.fold, self.notebook
        widgets = nb.widgets
        captured: dict[str, list[Stream | Rich | Other]] = {}
        items: list[Stream | Rich | Other] = []
        for item in f.items:
            if item.owner is None or item.owner == ELSEWHERE:
                items.append(item)
                continue
            if item.owner not in captured:  # where the widget's captures are read, if it was shown before
                captured[item.owner] = []
                items.append(Other({"output_type": "captured", "model": item.owner}, 0, ELSEWHERE))
            captured[item.owner].append(item)
        replaced = set()  # Output widgets whose earlier outputs a clear_output removed: they read whole, not what they gained
        for model in f.cleared_owners | captured.keys():
            if model in f.cleared_owners and (widgets.get(model) or {}).get("outputs"):
                replaced.add(model)
            widgets.capture(model, [output(i) for i in captured.get(model, [])], model in f.cleared_owners)
        here = {m for i in items if isinstance(i, Rich) and i.owner is None and (m := model_of(i.data))}
        f.items = []
        for item in items:
            if isinstance(item, Other) and item.output.get("output_type") == "captured":
                model = item.output["model"]
                if model in nb.views and model not in here and (whole := tree(model, widgets.get)) is not None:
                    outs = with_trees([output(i) for i in captured[model]], widgets.get, 1)
                    f.items.append(self._update(model, whole, {}) if model in replaced else
                                   self._update(model, {"kind": "Output", "outputs": outs}, {"captured": True}))
                continue
            view = model_of(item.data) if isinstance(item, Rich) and item.owner is None else None
            if isinstance(item, Rich) and view is not None:
                shown = tree(view, widgets.get)
                if shown is not None:
                    item.extra["widget"] = shown
                    item.size += clean.size(shown)
                    nb.views.pop(view, None)
                    nb.views[view] = (self.call, _digest(shown))
            f.items.append(item)
        changed, widgets.changed = widgets.changed, False
        for model, (call, digest) in list(nb.views.items()) if changed else []:  # any other change of a widget shown
            if model in here:
                continue
            shown = tree(model, widgets.get)
            if shown is None:
                del nb.views[model]  # closed: a notebook shows it no more
            elif (now := _digest(shown)) != digest:
                nb.views[model] = (call, now)
                if model not in captured:  # else its captures were read where they were written
                    f.items.append(self._update(model, shown, {}))
        while len(nb.views) > MAX_VIEWS:
            nb.views.pop(next(iter(nb.views)))
        f.rich_bytes = sum(i.size for i in f.items if isinstance(i, Rich))

    def _update(self, model: str, shown: dict[str, Any], extra: dict[str, Any]) -> Rich:
        """An update of widget `model`, shown by an earlier call: what it shows now (or what it gained)."""
        call = self.notebook.views[model][0]
        extra = {"widget": shown, "updated": True, **({"calls_ago": self.call - call} if call else {}), **extra}
        data = {VIEW: {"model_id": model}, "text/plain": f"{shown.get('kind')} widget"}
        return Rich("display_data", data, clean.size(data) + clean.size(extra), None, extra, ELSEWHERE)

    def _fit(self) -> None:
        """Rich outputs from the last, then tracebacks, until the whole observation is within max_observation_bytes."""
        f = self.fold

        # the outputs, and the text of streams and results once more: the log stored that beside them before it
        # stored the outputs once, and a call keeps what it kept then
        def total() -> int:
            outs = f.outputs()
            return clean.size(outs) + sum(clean.size(o["text"]) for o in outs if o["output_type"] == "stream") + sum(
                clean.size(o["data"].get("text/plain", "")) for o in outs if o["output_type"] == "execute_result")

        over = total() - self.budget.max_bytes
        while over > 0:
            rich = [i for i in f.items if isinstance(i, Rich)]
            if not rich:
                break
            f.items.remove(rich[-1])
            f.rich_bytes -= rich[-1].size
            f.over_bytes += 1
            over = total() - self.budget.max_bytes
        for name, budget in list(f.streams.items()):  # text alone over the budget (a large output_limit)
            if over > 0:
                f._trim(name, budget, over // 2 + 1000)
                over = total() - self.budget.max_bytes
        if over > 0:
            for item in f.items:
                if isinstance(item, Other) and len(item.output.get("traceback") or []) > 1:
                    item.output["traceback"] = item.output["traceback"][-1:]
                    self.note(f"[a traceback truncated to its last line: the output was over {self.budget.max_bytes:,} "
                              "bytes (max_observation_bytes)]")


def _digest(shown: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(shown, option=orjson.OPT_SORT_KEYS)).hexdigest()


def setup_code(limit: int) -> str:
    """The code every new kernel runs first (silently): the in-kernel output cap."""
    from pathlib import Path

    source = Path(__file__).with_name("kernel_cap.py").read_text()
    return source + f"\ninstall({int(limit)})\ndel install, terminal_write, RAW_FACTOR, DRAIN_MARK, DRAIN_WAIT\n"


def death_note(how: str, started: bool = True) -> str:
    """What the model is told when the kernel died during its call, or before the call started in it."""
    if not started:
        return (f"the kernel died ({how}) before it said this call started: its code may not have run at all, or was "
                "stopped as it began; the kernel's in-memory state (variables, imports, open files) is gone. The next "
                "call runs in a fresh kernel.")
    return (f"the kernel died ({how}) while running this call; its in-memory state "
            "(variables, imports, open files) is gone. The next call runs in a fresh kernel.")


def stuck_note(timeout: float, grace: float) -> str:
    """What the model is told when a call ignored its interrupt and the kernel was replaced."""
    return (f"the call ran past its {timeout:g} s timeout and ignored the interrupt for {grace:g} s, "
            "so its kernel was killed; its in-memory state is gone. The next call runs in a fresh kernel.")


TIMED_OUT = "[timed out after {timeout:g} s: the call was interrupted; the kernel and its state survive]"
