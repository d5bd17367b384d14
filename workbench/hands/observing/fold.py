"""Folding one call's outputs the way JupyterLab's output area does, within a budget.

What a kernel emits during a call is a sequence: streams, displays, execute results, errors,
`clear_output` and `update_display_data`. A person reading the cell sees that sequence *folded*:

- consecutive writes to one stream join into one output (as JupyterLab merges them), and a
  carriage return or backspace overwrites what it overwrites on a terminal (a progress bar
  shows its last state);
- `clear_output()` empties the outputs; `clear_output(wait=True)` empties them when the next
  output arrives (not on a display update), so a `clear_output(wait=True); print(i)` loop shows
  only its last frame;
- `update_display_data` replaces the data of every output shown with that display id (an
  update of an id an earlier call showed is read in this call as an update of it, since the
  earlier call's result is history: owned by `ELSEWHERE`, so no clear_output of this call
  removes it);
- each execute result, display and error is an output of its own, in order;
- while an Output widget captures (`with out:`), what is written is folded in its place, owned by
  the widget: a `clear_output` then clears only the widget's outputs, and a `clear_output` outside
  it leaves them (they are the widget's, wherever it is shown; collect.py moves them there).

`Fold` holds that state, bounded: the text of each stream keeps its first `limit // 2`
characters and its last `limit - limit // 2` (the final state of a long run matters most),
with a count of what was cut in between; rich outputs count against `max_displays` (displays
and results each) and `max_bytes` (their bundles as the log stores them). A cleared output
frees its budget. `outputs()` gives the folded sequence as nbformat-like dicts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import clean
from .kernel_cap import terminal_write

OVERWRITE = re.compile(r"[\r\x08]")
KEPT = ("execution_count", "updated", "calls_ago")  # what an output keeps of its own when a display update replaces it
ELSEWHERE = "\x00elsewhere"  # the owner of what a call changed elsewhere in the notebook: no clear_output of it clears it


def overwrite(text: str) -> str:
    """`text` as a terminal leaves it: `\\r` returns to the line's start and overwrites, `\\b` deletes a character."""
    if not OVERWRITE.search(text):
        return text
    done, line, _ = terminal_write("", 0, text)
    return done + line


@dataclass
class Stream:
    """One stream output: its first characters, how many were cut after them, and its last ones."""

    name: str
    owner: str | None = None  # the Output widget that captured it (its comm id), if any
    head: str = ""
    cut: int = 0
    tail: str = ""
    col: int | None = None  # the cursor's column in the last line, when it is not at its end

    def text(self) -> str:
        if not self.cut:
            return self.head + self.tail
        return f"{self.head}\n[... {self.cut:,} characters of {self.name} cut here ...]\n{self.tail}"

    def last_line(self) -> str:
        """Take the text after the last newline out of this stream (to overwrite it), and return it."""
        if self.tail or self.cut:
            i = self.tail.rfind("\n") + 1
            line, self.tail = self.tail[i:], self.tail[:i]
        else:
            i = self.head.rfind("\n") + 1
            line, self.head = self.head[i:], self.head[:i]
        return line


@dataclass
class Rich:
    """A display or execute result: its bundle as kept, its display id, its size in the log."""

    output_type: str  # display_data, execute_result
    data: dict[str, Any]
    size: int
    display_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # execution_count, source (page), svg rendered as png, ...
    owner: str | None = None


@dataclass
class Other:
    """An output that is text only: an error, or a payload of the reply (set_next_input)."""

    output: dict[str, Any]
    size: int
    owner: str | None = None


@dataclass
class StreamBudget:
    head_used: int = 0  # characters in the heads of this stream's outputs
    tail_used: int = 0  # characters in their tails
    lost: int = 0  # characters in outputs cut away entirely


class Fold:
    """The outputs of one call as they stand, folded and bounded."""

    def __init__(self, limit: int, max_displays: int, max_bytes: int):
        self.limit, self.max_displays, self.max_bytes = limit, max_displays, max_bytes
        self.head_room, self.tail_room = limit // 2, limit - limit // 2
        self.items: list[Stream | Rich | Other] = []
        self.clear_next: set[str | None] = set()  # owners (None: the call itself) with a clear_output(wait=True) pending
        self.capturing: list[str] = []  # the Output widgets capturing now, innermost last
        self.streams: dict[str, StreamBudget] = {}
        self.rich_bytes = 0
        self.over_count: dict[str, int] = {}  # rich outputs dropped over max_displays, by type
        self.over_bytes = 0  # rich outputs dropped over max_bytes
        self.cleared = 0  # how many times the outputs were cleared
        self.cleared_ids: set[str] = set()  # display ids of this call's own displays a clear_output removed
        self.cleared_owners: set[str] = set()  # the Output widgets a clear_output emptied

    # -- what the kernel sends ------------------------------------------------

    @property
    def owner(self) -> str | None:
        return self.capturing[-1] if self.capturing else None

    def capture(self, widget: str, on: bool) -> None:
        """An Output widget starts (`on`) or stops capturing what is written."""
        if widget in self.capturing:
            self.capturing.remove(widget)
        if on:
            self.capturing.append(widget)

    def _arrive(self) -> None:
        """A new output arrives: a pending clear_output(wait=True) of its owner happens now."""
        if self.owner in self.clear_next:
            self.clear_next.discard(self.owner)
            self._clear(self.owner)

    def clear(self, wait: bool) -> None:
        if wait:
            self.clear_next.add(self.owner)
        else:
            self.clear_next.discard(self.owner)
            self._clear(self.owner)

    def _clear(self, owner: str | None) -> None:
        self.cleared_ids |= {i.display_id for i in self.items if isinstance(i, Rich) and i.owner == owner
                             and i.display_id and not i.extra.get("updated")}
        self.items = [i for i in self.items if i.owner != owner]
        if owner is not None:
            self.cleared_owners.add(owner)
        self.streams = {}
        for i in self.items:
            if isinstance(i, Stream):
                b = self.streams.setdefault(i.name, StreamBudget())
                b.head_used += len(i.head)
                b.tail_used += len(i.tail)
        self.rich_bytes = sum(i.size for i in self.items if isinstance(i, Rich))
        if owner is None:
            self.over_count = {}
            self.over_bytes = 0
        self.cleared += 1

    def stream(self, name: str, text: str) -> None:
        """Append to stream `name` (to its last output if that is the last output of all, else a new one)."""
        self._arrive()
        if not text:
            return
        last = self.items[-1] if self.items else None
        if isinstance(last, Stream) and last.name == name and last.owner == self.owner:
            seg = last
        else:
            seg = Stream(name, self.owner)
            self.items.append(seg)
        b = self.streams.setdefault(name, StreamBudget())
        if seg.col is not None or OVERWRITE.search(text):  # the last line is written on where its cursor is
            before = seg.cut or seg.tail
            line = seg.last_line()
            if before:
                b.tail_used -= len(line)
            else:
                b.head_used -= len(line)
            done, line, col = terminal_write(line, len(line) if seg.col is None else min(seg.col, len(line)), text)
            seg.col = col if col < len(line) else None
            text = done + line
        room = self.head_room - b.head_used
        if room > 0 and not seg.cut and not seg.tail:
            seg.head += text[:room]
            b.head_used += len(text[:room])
            text = text[room:]
        if not text:
            return
        if len(text) >= self.tail_room:  # this alone fills the tail: every older tail of the stream goes
            self._trim(name, b, b.tail_used)
            seg.cut += len(text) - self.tail_room
            text = text[len(text) - self.tail_room:]
        seg.tail += text
        b.tail_used += len(text)
        self._trim(name, b, b.tail_used - self.tail_room)

    def cut(self, name: str, n: int) -> None:
        """`n` characters of stream `name` were dropped (in the kernel) just before its last `tail_room` ones."""
        if n <= 0:
            return
        for item in reversed(self.items):
            if isinstance(item, Stream) and item.name == name:
                item.cut += n
                return
        self.streams.setdefault(name, StreamBudget()).lost += n

    def _trim(self, name: str, b: StreamBudget, excess: int) -> None:
        """Cut `excess` characters from the oldest tails of stream `name`; drop outputs left empty."""
        if excess <= 0:
            return
        keep: list[Stream | Rich | Other] = []
        for item in self.items:
            if excess > 0 and isinstance(item, Stream) and item.name == name and item.tail:
                k = min(excess, len(item.tail))
                item.tail, item.cut = item.tail[k:], item.cut + k
                b.tail_used -= k
                excess -= k
                if not item.head and not item.tail:  # nothing left of it but the count
                    b.lost += item.cut
                    continue
            keep.append(item)
        self.items = keep

    def rich(self, output_type: str, data: dict[str, Any], display_id: str | None = None,
             extra: dict[str, Any] | None = None) -> None:
        """A display or execute result with its (checked) bundle. One with a display id also updates the
        displays already shown with that id (IPython: "any future display with the same ID will also update
        other displays that had the same ID"), as nbclient and the classic notebook do."""
        self._arrive()
        extra = extra or {}
        updated = bool(extra.get("updated"))  # of a display an earlier call showed: not this call's, nor a widget's
        if display_id is not None and not updated:
            self.update(display_id, data, {k: v for k, v in extra.items() if k != "execution_count"})
        size = clean.size(data) + clean.size(extra)
        if sum(1 for i in self.items if isinstance(i, Rich) and i.output_type == output_type) >= self.max_displays:
            self.over_count[output_type] = self.over_count.get(output_type, 0) + 1
            return
        if self.text_bytes() + self.rich_bytes + size > self.max_bytes:
            self.over_bytes += 1
            return
        self.items.append(Rich(output_type, data, size, display_id, extra, ELSEWHERE if updated else self.owner))
        self.rich_bytes += size

    def update(self, display_id: str, data: dict[str, Any], extra: dict[str, Any] | None = None) -> bool:
        """Replace the data of every output shown with `display_id`; False if none is shown in this call."""
        extra = extra or {}
        size = clean.size(data) + clean.size(extra)
        targets = [i for i in self.items if isinstance(i, Rich) and i.display_id == display_id]
        if not targets:
            return False
        grow = sum(size - t.size for t in targets)
        if self.text_bytes() + self.rich_bytes + grow > self.max_bytes:
            self.over_bytes += 1
            return True
        for t in targets:
            kept = {k: v for k, v in t.extra.items() if k in KEPT}
            t.data, t.size, t.extra = data, size, {**kept, **extra}
        self.rich_bytes += grow
        return True

    def other(self, output: dict[str, Any]) -> None:
        """An error or a reply payload, in its place."""
        self._arrive()
        self.items.append(Other(output, clean.size(output), self.owner))

    # -- what there is -----------------------------------------------------

    def text_bytes(self) -> int:
        """A quick lower bound of the text's bytes so far."""
        return sum(b.head_used + b.tail_used for b in self.streams.values()) + sum(
            i.size for i in self.items if isinstance(i, Other))

    def notes(self) -> list[str]:
        """What was cut, for the model."""
        notes = []
        for name, b in self.streams.items():
            cut = b.lost + sum(i.cut for i in self.items if isinstance(i, Stream) and i.name == name)
            if cut:
                notes.append(f"[{name} truncated: showed its first {b.head_used:,} and last {b.tail_used:,} characters, "
                             f"cut {cut:,} in between; write large output to a file and read parts of it]")
        return notes

    def outputs(self) -> list[dict[str, Any]]:
        """The folded outputs, nbformat-like: stream (name, text), display_data / execute_result (data, and
        display_id, execution_count, ... when known), error (ename, evalue, traceback), and payloads."""
        return [output(item) for item in self.items]


def output(item: Stream | Rich | Other) -> dict[str, Any]:
    """One folded output, nbformat-like (see Fold.outputs)."""
    if isinstance(item, Stream):
        return {"output_type": "stream", "name": item.name, "text": item.text()}
    if isinstance(item, Rich):
        o: dict[str, Any] = {"output_type": item.output_type, "data": item.data}
        if item.display_id is not None:
            o["display_id"] = item.display_id
        o.update(item.extra)
        return o
    return item.output
