"""HTML pieces both review views share: a memory, a diff, source events in context, a dream's timeline.

Every value here comes from a session, a kernel, a dream or a person, so every
one goes through `esc` (text and attribute values alike), except a memory's text,
which is Markdown rendered by `markdown_html` with raw HTML escaped; only the
constants of this module are markup.
"""

from __future__ import annotations

import difflib
import html
from datetime import datetime
from types import MappingProxyType
from typing import Any

from ...plugins.text import event_text, markdown_html as text_markdown_html

STATUS_OPTIONS = ("all", "proposed", "accepted", "rejected", "superseded", "retired", "redacted")
CONTEXT = 2  # events shown on each side of a cited one
STATUS_COLORS = MappingProxyType({"proposed": "#b26b00", "accepted": "#1a7f37", "rejected": "#a40e26", "superseded": "#6e7781",
                                  "retired": "#6e7781", "redacted": "#6e7781"})
MESSAGE_COLORS = MappingProxyType({"success": "#1a7f37", "danger": "#a40e26", "warning": "#b26b00"})


def esc(s: Any) -> str:
    """Any value as HTML text, quotes included, so it is safe in element text and attribute values alike."""
    return html.escape(str(s), quote=True)


def markdown_html(text: str) -> str:
    """A memory's Markdown text as HTML: raw HTML in it shown as text, no images, links only to safe schemes
    (workbench/markdown.py: the one renderer of Markdown, the agent's answers' too)."""
    return f'<div class="wb-markdown">{text_markdown_html(text, highlight=False)}</div>'


def who(actor: Any) -> str:
    """An actor (docs/memory.md) as a reader names it: a person or an API client by name; a dream or an agent
    keeps its session's id, which the panel's timeline and sources use."""
    a = str(actor or "")
    kind, _, name = a.partition(":")
    return name if kind in ("person", "api") and name else a


def when(ts: Any) -> str:
    """A stored timestamp as people read it, in this machine's time zone: '2 Dec 2026 13:05' (itself if not a time)."""
    try:
        t = datetime.fromisoformat(str(ts)).astimezone()
    except ValueError:
        return str(ts)
    return f"{t.day} {t:%b %Y %H:%M}"


def message_html(text: str, kind: str) -> str:
    """A one-line status message (an action's outcome or its error), escaped."""
    color = MESSAGE_COLORS.get(kind, "#444")
    return f'<div class="wb-message-{esc(kind)}" style="color:{color};padding:4px 0">{esc(text)}</div>'


def badge(status: str) -> str:
    color = STATUS_COLORS.get(status, "#444")
    # one word on one line, however narrow its column ("PROPOSE/D" reads as nothing)
    style = f"color:#fff;background:{color};padding:1px 6px;border-radius:8px;font-size:0.85em;white-space:nowrap"
    return f'<span class="wb-status" style="{style}">{esc(status)}</span>'


def memory_html(m: dict[str, Any]) -> str:
    """A memory's title, status, kind, tags and text."""
    what = str(m["proposal"]) + (f" of {', '.join(map(str, m['targets']))}" if m["targets"] else "")
    tags = " ".join(f"<code>{esc(t)}</code>" for t in m["tags"])
    by = f"proposed by {esc(who(m['created_by']))}" + (
        f", last change by {esc(who(m['updated_by']))} on {esc(when(m['updated_at']))}" if m["updated_by"] != m["created_by"] else "")
    return (f'<div class="wb-memory"><h3 style="margin:4px 0">{esc(m["title"])}</h3>'
            f"<div>{badge(m['status'])} <i>{esc(what)}</i> · v{esc(m['version'])} · {by} {tags}</div>"
            f'<div class="wb-memory-text" style="background:#f6f8fa;padding:0 8px;overflow-wrap:anywhere">'
            f'{markdown_html(m["text"])}</div></div>')


def history_html(m: dict[str, Any]) -> str:
    """A memory's versions, oldest first: number, action, who and when, and each note."""
    rows = [f"<li>v{esc(v['version'])} · {esc(v['action'])} · {esc(who(v['actor']))} · {esc(when(v['ts']))}"
            + (f" · <i>{esc(v['note'])}</i>" if v.get("note") else "") + "</li>" for v in m.get("history") or []]
    return f'<div class="wb-history"><b>history</b><ol style="margin:2px 0">{"".join(rows)}</ol></div>' if rows else ""


def chain_html(m: dict[str, Any]) -> str:
    """What this memory replaced and what replaced it (kind, who, when), and the memory in effect now."""
    rows = []
    for key, says in (("supersedes", "replaced"), ("superseded_by", "replaced by")):
        for link in m.get(key) or []:
            rows.append(f"<div>{esc(says)} <code>{esc(link['id'])}</code> {badge(link['status'] or 'unknown')} "
                        f"{esc(link['title'] or '')} · {esc(link['kind'])} by {esc(who(link['actor']))} on {esc(when(link['ts']))}</div>")
    if m.get("current") and m["current"] != m["id"]:
        rows.append(f"<div>in effect now: <code>{esc(m['current'])}</code></div>")
    return f'<div class="wb-chain"><b>chain</b>{"".join(rows)}</div>' if rows else ""


def conflicts_html(m: dict[str, Any]) -> str:
    """Each memory this one looks contradictory to, side by side with it, and why."""
    if not m.get("conflicts"):
        return ""
    side = ('<td style="vertical-align:top;padding:4px;border:1px solid #d0d7de;width:50%">'
            '<code>{}</code> {} <small>{}</small><div><b>{}</b></div><pre style="white-space:pre-wrap">{}</pre></td>')
    rows = []
    for c in m["conflicts"]:
        rows.append("<tr>" + side.format(esc(m["id"]), badge(m["status"]), esc(m["updated_at"][:10]), esc(m["title"]), esc(m["text"]))
                    + side.format(esc(c["id"]), badge(c["status"]), esc(c["updated_at"][:10]), esc(c["title"]), esc(c["text"]))
                    + f'</tr><tr><td style="padding:4px"><small>why: {esc(c["why"])}</small></td></tr>')
    return ('<div class="wb-conflicts"><b>looks contradictory to</b> (resolve: supersede the older by the newer, '
            f'retire or reject one)<table style="border-collapse:collapse;width:100%">{"".join(rows)}</table></div>')


def diff_html(old: str, new: str, old_name: str = "current", new_name: str = "proposed") -> str:
    """A unified diff, lines coloured, of a proposed edit against the memory it would replace."""
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm="")
    out = []
    for line in lines:
        color = "#1a7f37" if line.startswith("+") else "#a40e26" if line.startswith("-") else "#444"
        out.append(f'<span style="color:{color}">{esc(line)}</span>')
    return '<pre class="wb-diff" style="background:#f6f8fa;padding:8px">' + ("\n".join(out) or "(no change in text)") + "</pre>"


def proposal_diffs(m: dict[str, Any], get: Any) -> str:
    """Diffs of an edit or merge proposal against each memory it would replace ('' for a new memory)."""
    if m["proposal"] not in ("edit", "merge") or not m["targets"]:
        return ""
    parts = []
    for t in m["targets"]:
        try:
            old = get(t)
        except Exception as e:  # a target that cannot be read is shown, not hidden
            parts.append(f"<div>{esc(t)}: {esc(e)}</div>")
            continue
        parts.append(f"<div><b>{esc(t)}</b> ({esc(old['status'])}) → this proposal</div>" + diff_html(old["text"], m["text"], t, m["id"]))
    return "".join(parts)


def event_summary(e: dict[str, Any]) -> str:
    """The text of an event (a tool call is prefixed with its tool's name), for escaping into a panel."""
    text = event_text(e)
    if e["type"] == "tool_started":
        return f"{e['payload'].get('name')}: {text}"
    return text

def _mark(text: str, quote: str | None) -> str:
    body = esc(text)
    if quote and esc(quote) in body:
        body = body.replace(esc(quote), f'<mark class="wb-quote">{esc(quote)}</mark>', 1)
    return body


def context_html(events: list[dict[str, Any]], seq: int, quote: str | None = None, limit: int = 1500) -> str:
    """Source events around a cited one, the cited event outlined and its quote marked."""
    rows = []
    for e in events:
        cited = e["seq"] == seq
        text = event_summary(e)
        text = text if len(text) <= limit else text[:limit] + " …"
        style = "border:2px solid #b26b00;" if cited else "border:1px solid #ddd;"
        rows.append(f'<div class="wb-event{" wb-cited" if cited else ""}" style="{style}padding:4px;margin:2px 0">'
                    f"<b>#{esc(e['seq'])} {esc(e['type'])}</b>"
                    f'<pre style="white-space:pre-wrap;margin:2px 0">{_mark(text, quote if cited else None)}</pre></div>')
    if not any(e["seq"] == seq for e in events):
        rows.append(f"<div><b>event #{esc(seq)} does not exist</b></div>")
    return "".join(rows)


def timeline_html(events: list[dict[str, Any]], limit: int = 300) -> str:
    """A dream's own session as a timeline: seq, time, type and a line of text per event."""
    rows = []
    for e in events:
        text = event_summary(e).replace("\n", " ")
        rows.append(f"<tr><td>{esc(e['seq'])}</td><td>{esc(e['ts'][11:19])}</td><td><code>{esc(e['type'])}</code></td>"
                    f"<td>{esc(text[:limit])}{' …' if len(text) > limit else ''}</td></tr>")
    return ('<table class="wb-timeline"><tr><th>seq</th><th>time</th><th>type</th><th>what</th></tr>'
            + "".join(rows) + "</table>")
