"""The results as markdown: the table printed by every run and docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EXTRA_SKIP = {"case", "n", "p50_ms", "p95_ms", "p99_ms", "min_ms", "max_ms"}


def _num(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}"
    return str(x)


def section_md(key: str, s: dict[str, Any]) -> str:
    out = [f"### {s['title'] if s['status'] == 'ok' else key}", ""]
    if s["status"] != "ok":
        out += [f"**{s['status']}**: {s['reason']}", ""]
        return "\n".join(out)
    if s["rows"]:
        has99 = any("p99_ms" in r for r in s["rows"])
        head = ["case", "n", "p50 ms", "p95 ms"] + (["p99 ms"] if has99 else []) + ["notes"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in s["rows"]:
            extra = ", ".join(f"{k}={_num(v)}" for k, v in r.items() if k not in EXTRA_SKIP)
            cells = [r["case"], str(r["n"]), _num(r["p50_ms"]), _num(r["p95_ms"])]
            if has99:
                cells.append(_num(r.get("p99_ms")))
            out.append("| " + " | ".join(cells + [extra]) + " |")
        out.append("")
    if s["comparisons"]:
        out += ["| comparison | value | baseline | ratio | difference | target | met |", "|---|---|---|---|---|---|---|"]
        for c in s["comparisons"]:
            met = "–" if c["met"] is None else ("met" if c["met"] else "**not met**")
            out.append(f"| {c['what']} | {_num(c['value'])} {c['unit']} | {_num(c['baseline'])} {c['unit'] if c['baseline'] is not None else ''} "
                       f"| {_num(c['ratio'])} | {_num(c['difference'])} | {c['target'] or '–'} | {met} |")
        out.append("")
    out += [f"- {n}" for n in s["notes"]]
    if s["notes"]:
        out.append("")
    return "\n".join(out)


def goals_md(result: dict[str, Any]) -> str:
    """Issue 24's Done-when, one row a goal: the figure, its floor in the same run, their ratio, the target, and
    for a goal not met, why (where the profiled CPU went); with `--before`, the same goal on the old code."""
    before = {g["goal"]: g for s in (result.get("before") or {}).get("sections", {}).values() for g in s.get("goals", [])}
    head = ["goal", "measured", "floor (same run)", "ratio", "target", "met"] + (["before"] if before else []) + ["why not"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in result["sections"].values():
        for g in s.get("goals", []):
            floor = f"{_num(g['floor'])} {g['unit']} ({g['floor_what']})" if g["floor"] is not None else "–"
            cells = [g["goal"], f"{_num(g['value'])} {g['unit']}", floor, _num(g["ratio"]), g["target"],
                     "met" if g["met"] else "**not met**"]
            if before:
                b = before.get(g["goal"])
                cells.append(f"{_num(b['value'])} {b['unit']}" if b else "–")
            out.append("| " + " | ".join(cells + [g["why"] or ""]) + " |")
    for key, s in result["sections"].items():
        if s["status"] != "ok" and key in GOAL_SECTIONS:
            out.append(f"| {key} | {s['status']}: {s['reason']} |" + " |" * (len(head) - 2))
    return "\n".join(out)


GOAL_SECTIONS = ("harness", "start", "log", "logscale", "hands_scale", "evals")  # where the Done-when is measured


def targets_md(result: dict[str, Any]) -> str:
    rows = [c for s in result["sections"].values() for c in s.get("comparisons", []) if c.get("target")]
    out = ["| target | figure | met |", "|---|---|---|"]
    for c in rows:
        fig = f"{_num(c['value'])} {c['unit']}"
        if c["kind"] == "ratio" and c["ratio"] is not None:
            fig += f" (ratio {_num(c['ratio'])})"
        elif c["kind"] == "difference" and c["difference"] is not None:
            fig += f" ({c['difference']:+.2f} {c['unit']} vs {_num(c['baseline'])} {c['unit']})"
        out.append(f"| {c['what']}: {c['target']} | {fig} | {'met' if c['met'] else '**not met**'} |")
    for key, s in result["sections"].items():
        if s["status"] != "ok":
            out.append(f"| {key} | {s['status']}: {s['reason']} | – |")
    return "\n".join(out)


def machine_md(m: dict[str, Any]) -> str:
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    return "\n".join([
        f"- CPU: {m['cpu']}, {m['cores']} cores",
        f"- RAM: {m['ram_gib']} GiB",
        f"- OS: {m['os']}",
        f"- Python: {m['python']}",
        f"- Packages: {pk}",
        f"- Load average (1, 5, 15 min) at start: {m['load_average']}, at the end: {m.get('load_average_end')}",
    ])


def markdown(result: dict[str, Any]) -> str:
    """The whole run as markdown: targets first, then each section."""
    parts = [f"## Workbench benchmarks ({result['mode']} mode, {result['started_at']})", "",
             machine_md(result["machine"]), "", "### Done when (issue 24)", "", goals_md(result), "",
             "### Targets", "", targets_md(result), ""]
    for key, s in result["sections"].items():
        parts.append(section_md(key, s))
    return "\n".join(parts)


DOC_HEAD = """# Benchmarks

Generated by `python -m bench --write-docs` (see [bench/README.md](../bench/README.md)); do not edit by hand.
The raw results of the same run are in [benchmarks.json](benchmarks.json).
Each comparison runs both sides in the same process run; figures are p50 / p95 over repeated trials,
in milliseconds unless marked. Each goal is reported against its floor, measured in the same run: what the
same work costs without the workbench (a raw `jupyter_client` execute, raw batched DuckDB appends, plain
SQL, a plain `jupyter server`). Targets are goals, printed as met or not met; the run never fails on them;
a goal not met says where the CPU went, from a py-spy profile of that measurement.
The figures depend on the machine and on what else ran on it at the time (see the load average below).

"""


KEPT = "<!-- kept by --write-docs: sections below come from benchmarks run on their own -->"


def write_docs(result: dict[str, Any], path: Path) -> None:
    """Regenerate docs/benchmarks.md from a full run; what follows the KEPT marker (e.g. `python -m
    bench.live_output`'s section) stays as it is."""
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(KEPT):] if KEPT in old else ""
    before = result.get("before")
    ran = f"Latest run: {result['started_at']}, {result['mode']} mode" + (
        f"; the `before` column is the same goals measured in this run on `{before['ref']}`." if before else ".")
    parts = [DOC_HEAD + ran, "", "## Machine", "", machine_md(result["machine"]), "", "## Done when (issue 24)", "",
             goals_md(result), "", "## Other targets", "", targets_md(result), ""]
    for key, s in result["sections"].items():
        parts.append(section_md(key, s).replace("### ", "## ", 1))
    path.write_text("\n".join(parts).rstrip("\n") + "\n" + ("\n" + kept.rstrip("\n") + "\n" if kept else ""))
    path.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
