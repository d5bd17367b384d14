"""What the model reads of a call's outputs: text where a person reads text, images where a person sees images.

The outputs (see fold.py) are rendered in their order into tool_result content blocks: text
parts joined into text blocks, and each image in its place as an image block. Per output:

- a stream: its text as a terminal shows it (carriage returns applied, ANSI escapes removed);
  stderr is marked `[stderr]`;
- a display or execute result: an image block if its bundle holds a PNG, JPEG, GIF or WebP (or an
  SVG the hands rendered as PNG); else the text of what JupyterLab would render: a widget's text
  state, Markdown or LaTeX as their source, HTML as readable text (tables as text tables), JSON as
  JSON; plain text last. A `text/plain` that is only a default repr (`<... object at 0x...>`)
  gives way to any richer part. ANSI escapes are removed everywhere;
- a widget (with its tree, widgets.py): its kind named, then what it shows: a widget that holds
  state as one line with its description and value, a container its children (under their
  titles), an Output widget what it captured, each indented, images in their places;
- an update of what an earlier call showed (`updated`): a line naming the display (or the widget)
  and the call, then what it now shows (of an Output widget that only gained outputs, what it
  gained);
- an error: its traceback, without ANSI escapes;
- a pager payload (`len?`, `%pinfo`): its text; `set_next_input`: the text the kernel proposes.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

from .fold import overwrite
from .images import IMAGE_TYPES

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]")
PLACEHOLDER = re.compile(r"^<[\w.]+(?: object| at 0x[0-9a-fA-F]+|(?: object)? at 0x[0-9a-fA-F]+)>$|^<Figure size [^>]*>$")
WIDGET = "application/vnd.jupyter.widget-view+json"
OUTPUT_WIDGET = re.compile(r"^Output\((?:layout=.*)?\)$", re.S)
TEXT_ORDER = ("text/markdown", "text/latex", "text/html", "application/json")
MAX_CELL = 60  # characters of one table cell shown


def terminal(text: str) -> str:
    """Stream text as a terminal leaves it: no ANSI escapes, carriage returns applied."""
    return overwrite(ANSI.sub("", text))


def image_of(output: dict[str, Any]) -> tuple[str, str] | None:
    """(media type, base64 data) of the image the model sees for this output, if any."""
    data = output.get("data")
    if not isinstance(data, dict):
        return None
    for mime in IMAGE_TYPES:
        if isinstance(data.get(mime), str):
            return mime, "".join(data[mime].split())
    png = output.get("svg_png")
    if isinstance(png, str):
        return "image/png", png
    return None


def bundle_text(data: dict[str, Any]) -> str:
    """The text a person reads of a bundle without an image (see the module's doc)."""
    plain = data.get("text/plain")
    plain = plain if isinstance(plain, str) else None
    if WIDGET in data:
        return plain if plain is not None else "[a widget]"
    if plain is not None and not PLACEHOLDER.match(plain.strip()) and "text/html" in data and len(data) <= 3:
        return plain  # a DataFrame's or another object's own text: as compact as its HTML table, and exact
    for mime in TEXT_ORDER:
        value = data.get(mime)
        if value is None:
            continue
        if mime == "text/html" and isinstance(value, str):
            return html_text(value)
        if isinstance(value, str):
            return value
        return json.dumps(value, indent=1, ensure_ascii=False)[:200_000]
    if plain is not None:
        return plain
    others = sorted(k for k in data if isinstance(k, str))
    return f"[a display of {', '.join(others)[:300]}]" if others else ""


def output_text(output: dict[str, Any]) -> str | None:
    """The text of one output for the model (None: the output is an image, or says nothing)."""
    kind = output.get("output_type")
    if kind == "stream":
        text = terminal(str(output.get("text", "")))
        return ("[stderr]\n" + text) if output.get("name") == "stderr" else text
    if kind == "error":
        tb = "\n".join(ANSI.sub("", line) for line in output.get("traceback") or [] if isinstance(line, str))
        return tb or f"{output.get('ename')}: {output.get('evalue')}"
    if kind == "set_next_input":
        return f"[the kernel proposes this as the next input]\n{output.get('text', '')}"
    if kind in ("display_data", "execute_result"):
        if image_of(output) is not None:
            return None
        data = output.get("data")
        if isinstance(data, dict) and OUTPUT_WIDGET.match(str(data.get("text/plain", ""))) and WIDGET in data:
            return None  # an Output widget whose state is not known (widget_items shows a known one's outputs)
        text = bundle_text(data) if isinstance(data, dict) else ""
        return ANSI.sub("", text)  # a person sees colours, not escape codes (the pager's text is full of them)
    return None


Item = str | tuple[str, str]  # a text, or an image's (media type, base64 data)


def output_items(o: dict[str, Any], depth: int = 0) -> list[Item]:
    """What the model reads of one output, in order: texts and images; a widget as what it shows (widgets.py),
    an update of what an earlier call showed under a line that says which."""
    out: list[Item] = []
    if o.get("updated"):
        out.append(_indent(updated(o), depth))
    widget = o.get("widget")
    if isinstance(widget, dict) and o.get("output_type") in ("display_data", "execute_result"):
        if o.get("updated") and o.get("captured"):  # the line before says which widget: only what it gained
            return out + [i for inner in widget.get("outputs") or [] if isinstance(inner, dict)
                          for i in output_items(inner, depth + 1)]
        return out + widget_items(widget, depth)
    image = image_of(o) if o.get("output_type") in ("display_data", "execute_result") else None
    if image is not None:
        return [*out, image]
    text = output_text(o)
    if text:
        out.append(_indent(text.rstrip("\n") if o.get("output_type") == "stream" else text, depth))
    return out


def updated(o: dict[str, Any]) -> str:
    """The line before an update of what an earlier call showed: which display, from which call."""
    ago = o.get("calls_ago")
    when = ("the previous call" if ago == 1 else f"{ago} calls ago" if isinstance(ago, int) and ago > 1
            else "an earlier call")
    widget = o.get("widget")
    if isinstance(widget, dict):
        verb = "now also shows" if o.get("captured") else "is now"
        return f"[the {str(widget.get('kind'))[:100]} widget from {when} {verb}:]"
    return f"[display {str(o.get('display_id'))[:200]} from {when} is now:]"


def widget_items(w: dict[str, Any], depth: int = 0) -> list[Item]:
    """A widget's tree (widgets.tree) as the model reads it: its kind, then its line, its outputs or its children
    (each under its title, if it has one), indented."""
    kind = str(w.get("kind"))[:100]
    if "text" in w:
        return [_indent(f"[{kind} widget] {w.get('text')}".rstrip(), depth)]
    out: list[Item] = [_indent(f"[{kind} widget]", depth)]
    for o in w.get("outputs") or []:
        if isinstance(o, dict):
            out += output_items(o, depth + 1)
    titles = w.get("titles") or []
    for i, child in enumerate(w.get("children") or []):
        title = titles[i] if i < len(titles) and isinstance(titles[i], str) else ""
        if title:
            out.append(_indent(f"{title}:", depth + 1))
        if isinstance(child, dict):
            out += widget_items(child, depth + 1 + bool(title))
    return out


def _indent(text: str, depth: int) -> str:
    pad = "  " * depth
    return "\n".join(pad + line if line else line for line in text.split("\n")) if depth else text


CUT = "[... {n:,} characters cut here: the model reads at most output_limit characters of a call in all ...]"
STREAM_CUT = re.compile(r"\[\.\.\. ([0-9,]{1,30}) characters of \w+ cut here \.\.\.\]")  # fold.Stream.text()'s marker


def blocks(outputs: list[dict[str, Any]], before: list[str], after: list[str], text_limit: int | None = None,
           max_images: int | None = None) -> list[dict[str, Any]]:
    """tool_result content: text blocks and image blocks in the order of the outputs; `before` and `after`
    are notes (what was replayed; what was cut). Never empty: no output at all reads "(no output)".

    What the model reads is bounded as one budget: at most `text_limit` characters of text in all (the
    outputs' text and the notes together; over it, the first and the last part of the outputs' text, see
    `_within`) and the first `max_images` images; a note says what was left out."""
    items: list[str | tuple[str, str]] = []  # an output's text, or an image's (media type, base64 data)
    images = left_out = 0
    for item in (i for o in outputs for i in output_items(o)):
        if not isinstance(item, tuple):
            items.append(item)
        elif max_images is None or images < max_images:
            items.append(item)
            images += 1
        else:
            left_out += 1
    after = list(after)
    if left_out:
        after.append(f"[{left_out:,} more image(s) not shown: the model is shown at most {max_images} images of a call "
                     "(max_images); the stored result keeps them. Save figures to files and look at them a few at a time]")
    if text_limit is not None:
        items, before, after = _within(items, before, after, text_limit)
    out: list[dict[str, Any]] = []
    parts: list[str] = list(before)

    def flush() -> None:
        if parts:
            out.append({"type": "text", "text": "\n".join(parts)})
            parts.clear()

    for item in items:
        if isinstance(item, tuple):
            flush()
            out.append({"type": "image", "source": {"type": "base64", "media_type": item[0], "data": item[1]}})
        else:
            parts.append(item)
    parts.extend(after)
    flush()
    return out or [{"type": "text", "text": "(no output)"}]


def _within(items: list[Any], before: list[str], after: list[str], limit: int) -> tuple[list[Any], list[str], list[str]]:
    """The items and notes with at most `limit` characters of text in all (each string with the newline that
    joins it to the next). Notes are kept whole while they take at most half of it; the outputs' text keeps its
    first and its last part (half each of the room left: a long run's final state matters most)."""
    if _chars(before) + _chars(after) > limit // 2:  # notes in bulk (a replay of many calls) are cut too
        before, after = _cut(before, limit // 4), _cut(after, limit // 4)
    return _cut(items, limit - _chars(before) - _chars(after)), before, after


def _chars(items: list[Any]) -> int:
    return sum(len(t) + 1 for t in items if isinstance(t, str))


def _cut(items: list[Any], room: int) -> list[Any]:
    """The items (strings are text; anything else passes, in its place) with at most `room` characters of text:
    the first and the last characters of their text kept, and one CUT marker where the rest was."""
    total = _chars(items)
    if total <= room:
        return items
    keep = max(0, room - len(CUT.format(n=total)) - 2)  # the marker, and the newline of a piece cut at its end
    head, tail = keep // 2, keep - keep // 2
    out: list[Any] = []
    at = cut = 0
    marker = -1  # where the marker goes, once the text is first cut
    for item in items:
        if not isinstance(item, str):
            out.append(item)
            continue
        start, end = at, at + len(item) + 1  # its characters, and the newline after it
        at = end
        first = max(0, min(end, head) - start)  # of it, inside the first `head` characters
        last = max(0, end - max(start, total - tail))  # and inside the last `tail`
        if first + last >= end - start:
            out.append(item)
            continue
        cut += end - start - first - last
        for m in STREAM_CUT.finditer(item, first, len(item) + 1 - max(last, 1)):  # a stream's own cut, cut with it
            cut += int(m.group(1).replace(",", "")) - len(m.group())
        if first:
            out.append(item[:first])
        if marker < 0:
            marker = len(out)
            out.append("")
        if last > 1:
            out.append(item[len(item) + 1 - last:])
    out[marker] = CUT.format(n=cut)[:max(0, room - 1)]
    return [i for i in out if i != ""]


class _Text(HTMLParser):
    """HTML as readable text: block elements on lines of their own, tables as text tables, no scripts or styles."""

    BLOCKS = frozenset({"p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "tr", "table",
                        "section", "article", "header", "footer", "blockquote", "hr", "dt", "dd", "caption"})
    SKIP = frozenset({"script", "style", "head", "title", "template"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0
        self.pre = 0
        self.tables: list[list[list[str]]] = []  # the tables being read, innermost last
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skip += 1
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self._end_cell()
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self._end_cell()  # HTML lets a cell end where the next begins
            self.cell = []
        elif tag == "pre":
            self.pre += 1
            self._write("\n")
        elif tag == "li":
            self._write("\n- ")
        elif tag in self.BLOCKS:
            self._write("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in ("td", "th"):
            self._end_cell()
        elif tag == "table" and self.tables:
            self._end_cell()
            rows = self.tables.pop()
            self._write("\n" + table(rows) + "\n")
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
            self._write("\n")
        elif tag in self.BLOCKS and tag != "tr":
            self._write("\n")

    def _end_cell(self) -> None:
        if self.tables and self.cell is not None:
            if not self.tables[-1]:
                self.tables[-1].append([])
            self.tables[-1][-1].append(" ".join("".join(self.cell).split())[:MAX_CELL])
        self.cell = None

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if not self.pre:
            data = re.sub(r"\s+", " ", data)
        self._write(data)

    def _write(self, s: str) -> None:
        if self.cell is not None:
            self.cell.append(s)
        elif self.tables:
            pass  # text between cells of a table (whitespace, mostly)
        else:
            self.out.append(s)


def table(rows: list[list[str]]) -> str:
    """Rows of cells as a text table with aligned columns."""
    rows = [r for r in rows if r]
    if not rows:
        return ""
    n = max(len(r) for r in rows)
    rows = [r + [""] * (n - len(r)) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def html_text(html: str) -> str:
    """HTML as readable text (see _Text)."""
    p = _Text()
    try:
        p.feed(html)
        p.close()
    except Exception:  # html.parser is lenient; anything it still refuses is shown as its tags stripped
        return re.sub(r"<[^>]*>", "", html)
    text = "".join(p.out)
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")
