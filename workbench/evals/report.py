"""The report of an eval run: pass rates with Wilson intervals, cost and latency, a task × model grid,
each attempt's transcript one click away; and two runs side by side. Errors (attempts cut off by
something the model did not cause, after their retries) are counted apart: never in a pass rate.

`report_html(df, events_of)` is plain HTML (each attempt's cell opens its transcript, written by
the shared renderer, workbench/render.py); `report_panel(...)` puts it in a Panel layout for
a notebook. Every value comes from tasks, models and kernels, so every one is escaped here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Any

from ..plugins.text import event_text, parts
from .stats import comparisons

EventsOf = Callable[[str], Iterable[Any]]  # session id -> its events (Event objects or their JSON form)
SHOWN = ("user_message", "assistant_turn", "tool_started", "tool_result", "eval_verdict", "eval_finished", "turn_ended",
         "hands_died", "interrupted", "model_error", "turn_failed")
MAX_EVENT_CHARS = 4000


def esc(value: Any) -> str:
    import html

    return html.escape(str(value), quote=True)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (95% for z = 1.96); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def summary(df: Any) -> list[dict[str, Any]]:
    """Per model: n (attempts graded: passed or failed), passed, failed, rate (passed / n: errors are not in it),
    Wilson low/high, errors (attempts that ended as an error after their retries), unfinished, retried (errors tried
    again, over all its attempts), and over its finished attempts the total cost, mean wall time and tokens (input
    and output, and their sum)."""
    out = []
    finished = df[df["outcome"].notna()]
    for model in sorted(set(df["model"])):
        rows = df[df["model"] == model]
        m = finished[finished["model"] == model]
        graded = m[m["outcome"] != "error"]
        n, k = len(graded), int((graded["outcome"] == "pass").sum())
        low, high = wilson(k, n)
        tokens_in, tokens_out = int(m["input_tokens"].sum()), int(m["output_tokens"].sum())
        out.append({"model": model, "n": n, "passed": k, "failed": n - k, "rate": k / n if n else math.nan, "low": low,
                    "high": high, "errors": int((m["outcome"] == "error").sum()), "unfinished": len(rows) - len(m),
                    "retried": int((rows["tries"].fillna(1) - 1).sum()), "cost": float(m["cost"].sum()),
                    "mean_wall_s": float(m["wall_s"].mean()) if len(m) else math.nan, "input_tokens": tokens_in,
                    "output_tokens": tokens_out, "tokens": tokens_in + tokens_out})
    return out


def transcript_html(events: Iterable[Any]) -> str:
    """An attempt's events as escaped text blocks, in the words of the shared renderer."""
    rows = []
    for ev in events:
        seq, kind, _ = parts(ev)
        if kind not in SHOWN:
            continue
        text = event_text(ev)
        if len(text) > MAX_EVENT_CHARS:
            text = text[:MAX_EVENT_CHARS] + "…"
        rows.append(f'<div class="wb-ev wb-ev-{esc(kind)}"><b>#{esc(seq)} {esc(kind)}</b>'
                    f'<pre style="white-space:pre-wrap;margin:2px 0 6px">{esc(text)}</pre></div>')
    return "".join(rows) or "<i>no events</i>"


def _pct(x: float) -> str:
    return "–" if isinstance(x, float) and math.isnan(x) else f"{x:.0%}"


def _secs(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.1f} s"


def summary_html(df: Any) -> str:
    rows = "".join(
        f"<tr><td>{esc(r['model'])}</td><td>{r['passed']}/{r['n']}</td><td>{_pct(r['rate'])}</td>"
        f"<td>{_pct(r['low'])}–{_pct(r['high'])}</td><td>{r['errors']}</td><td>{r['retried']}</td><td>${r['cost']:.4f}</td>"
        f"<td>{_secs(r['mean_wall_s'])}</td><td>{r['tokens']:,}</td></tr>"
        for r in summary(df))
    return ('<table class="wb-eval-summary"><tr><th>model</th><th>passed</th><th>rate</th><th>95% CI (Wilson)</th>'
            '<th title="attempts cut off by something the model did not cause, after their retries: not in the rate">'
            'errors</th><th title="errors tried again">retried</th>'
            f"<th>cost</th><th>mean time</th><th>tokens</th></tr>{rows}</table>")


MARKS = MappingProxyType({"pass": ("✓", "#1a7f37"), "fail": ("✗", "#a40e26"), "error": ("⚠", "#9a6700")})
UNFINISHED = ("…", "#6e7781")


def grid_html(df: Any, events_of: EventsOf | None) -> str:
    """Tasks down, models across; each attempt a mark that opens its transcript."""
    models = sorted(set(df["model"]))
    head = "".join(f"<th>{esc(m)}</th>" for m in models)
    body = []
    for task in sorted(set(df["task"])):
        cells = []
        for model in models:
            marks = []
            for r in df[(df["task"] == task) & (df["model"] == model)].sort_values("epoch").to_dict("records"):
                mark, color = MARKS.get(r["outcome"], UNFINISHED) if isinstance(r["outcome"], str) else UNFINISHED
                tries = f", try {r['tries']}" if r["tries"] and r["tries"] > 1 else ""
                title = (f"epoch {r['epoch']}{tries}: {r['reason'] or 'unfinished'}, score {r['score']}, "
                         f"session {r['session_id']}")
                inner = transcript_html(events_of(r["session_id"])) if events_of is not None else ""
                marks.append(f'<details class="wb-attempt" data-session="{esc(r["session_id"])}" style="display:inline-block">'
                             f'<summary title="{esc(title)}" style="color:{color};cursor:pointer">{mark}</summary>'
                             f'<div class="wb-transcript" style="max-height:400px;overflow:auto;border:1px solid #ddd;'
                             f'padding:4px;width:600px">{inner}</div></details>')
            cells.append(f"<td>{''.join(marks)}</td>")
        body.append(f"<tr><th style='text-align:left'>{esc(task)}</th>{''.join(cells)}</tr>")
    return f'<table class="wb-eval-grid"><tr><th>task</th>{head}</tr>{"".join(body)}</table>'


def _signed(x: float) -> str:
    return f"{x:+.0%}"


def comparison_html(df: Any) -> str:
    """Each model after the first (by name) against the first: B − A over shared tasks, its interval and verdict."""
    rows = []
    for c in comparisons(df):
        if isinstance(c, str):
            rows.append(f'<tr><td colspan="5">{esc(c)}</td></tr>')
        else:
            rows.append(f"<tr><td>{esc(c.b)} − {esc(c.a)}</td><td>{_signed(c.estimate)}</td>"
                        f"<td>{_signed(c.low)} to {_signed(c.high)}</td><td>{c.n} ({c.wins} won, {c.losses} lost)</td>"
                        f"<td>{esc(c.verdict)}</td></tr>")
    if not rows:
        return ""
    return ('<h4>paired comparison</h4><table class="wb-eval-paired"><tr><th>B − A</th><th>pass rate</th>'
            '<th title="percentile bootstrap over tasks, seed 0">95% CI</th><th>tasks</th>'
            f'<th title="the interval and an exact sign test must both exclude no difference">verdict</th></tr>'
            f"{''.join(rows)}</table>")


def report_html(df: Any, events_of: EventsOf | None = None, title: str | None = None) -> str:
    """One run's report as HTML: the summary, the paired comparison (two models or more), then the grid
    (transcripts inside when `events_of` is given)."""
    runs = sorted(set(df["run"])) if len(df) else []
    name = title or (", ".join(runs) if runs else "eval run")
    return (f'<div class="wb-eval-report"><h3>{esc(name)}</h3>{summary_html(df)}{comparison_html(df)}'
            f"<h4>task × model</h4>{grid_html(df, events_of)}</div>")


def compare_html(a: Any, b: Any) -> str:
    """Two runs' pass rates per model, side by side."""
    sa, sb = {r["model"]: r for r in summary(a)}, {r["model"]: r for r in summary(b)}
    ra, rb = (", ".join(sorted(set(d["run"]))) for d in (a, b))
    rows = []
    for model in sorted(set(sa) | set(sb)):
        cells = []
        for s in (sa, sb):
            r = s.get(model)
            errors = f", {r['errors']} error(s)" if r and r["errors"] else ""
            cells.append(f"<td>{r['passed']}/{r['n']} ({_pct(r['rate'])}, {_pct(r['low'])}–{_pct(r['high'])}{errors})</td>"
                         if r else "<td>–</td>")
        rows.append(f"<tr><td>{esc(model)}</td>{''.join(cells)}</tr>")
    return (f'<table class="wb-eval-compare"><tr><th>model</th><th>{esc(ra)}</th><th>{esc(rb)}</th></tr>'
            f"{''.join(rows)}</table>")


def report_panel(df: Any, events_of: EventsOf | None = None, other: Any = None) -> Any:
    """A Panel view of a run (and, with `other`, a second run beside it and a comparison)."""
    import panel as pn

    if other is None:
        return pn.Column(pn.pane.HTML(report_html(df, events_of), sizing_mode="stretch_width"), sizing_mode="stretch_width")
    return pn.Column(
        pn.pane.HTML(compare_html(df, other), sizing_mode="stretch_width"),
        pn.Row(pn.pane.HTML(report_html(df, events_of)), pn.pane.HTML(report_html(other, events_of))),
        sizing_mode="stretch_width")
