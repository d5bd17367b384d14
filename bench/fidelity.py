"""Fidelity: does the model receive from its hands what a notebook shows a person?

    python -m bench.fidelity NOTEBOOK_DIR [--backend sandbox|local] [--json OUT] [-v]

Runs each notebook's code cells in order twice in a plain ipykernel through nbclient (the
reference: what JupyterLab shows) and once through the workbench's hands (what the model
receives), and compares them cell by cell on what a person sees (docs/fidelity.md):

- the reference's outputs are taken as JupyterLab shows them: consecutive writes to a stream
  joined; the pager's text of `len?` shown as an output (JupyterLab shows it below the cell);
  a proposed next input shown (JupyterLab makes a cell of it); an Output widget's captured
  outputs shown where the widget is;
- both sides become the same view: text as the model reads it (render.py: ANSI removed,
  carriage returns applied, rich text as text), images by presence and format (an SVG counts
  as the PNG the model gets), then normalized: memory addresses, execution counts and the
  kernel's temporary file names masked, trailing spaces and blank lines dropped;
- a cell is compared with the finished notebook (identical: passed) and, failing that, with
  the notebook as it stood when the call returned (at_return): the cell's own lines in their
  order, and besides them exactly the lines the call wrote elsewhere in the notebook (an update
  of an earlier cell's display, what an Output widget shown in an earlier cell captured), which
  the model reads in the call that wrote them; the finished notebook shows them in the earlier
  cell, changed perhaps again by later calls;
- a cell whose two reference runs differ is nondeterministic (time, random numbers) and is
  not compared, nor is one whose output ZMQ dropped before the hands read it (dropped: a
  reader that fell behind on a loaded machine; the model is told); a cell that differs only in a way docs/fidelity.md lists as intended (the
  output cap) counts as intended; anything else is different.

Cells that cannot run the same way in both are skipped and counted: cells that kill the kernel,
cells meant to be interrupted (an endless loop), cells tagged `skip-execution`, and notebooks of
another language. A `resources/` folder beside the notebooks is copied into both working
directories first. The notebooks themselves are never copied anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client import AsyncKernelManager
from traitlets import default

from workbench.hands.base import IDLE_NEVER_CAME
from workbench.hands.launching.channel import WakingKernelClient
from workbench.hands.observing import TIMED_OUT
from workbench.hands.observing.render import blocks
from workbench.hands.observing.widgets import model_of, tree

# cells that stop the kernel, or never end on their own: both sides would only measure the kill
KILLS = re.compile(r"os\.kill\(|os\._exit\(|sys\.exit\(|\bquit\(\)|\bexit\(\)|do_shutdown\(")
ENDLESS = re.compile(r"while\s+True\s*:\s*(?:continue|pass)\s*$", re.M)
ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
TEMPFILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py|ipykernel_\d+/\d+\.py")
PROMPT = re.compile(r"\b(In|Out|Cell In)\s*\[\s*\d+\s*\]")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# the notebook when a cell returned: every cell's outputs so far, and the widgets' state
Snapshot = tuple[list[list[dict[str, Any]]], dict[str, Any]]
CELL_TIMEOUT = 120


@dataclass
class Cell:
    """One compared cell: where it is, how it came out, and both views when they differ."""

    notebook: str
    index: int
    outcome: str  # passed, at_return, intended, different, nondeterministic, dropped, skipped
    why: str = ""
    reference: str = ""
    model: str = ""


@dataclass
class Report:
    cells: list[Cell] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for c in self.cells if c.outcome == outcome)

    @property
    def compared(self) -> int:
        return sum(self.count(o) for o in ("passed", "at_return", "intended", "different"))

    def summary(self) -> dict[str, Any]:
        skipped: dict[str, int] = {}
        for c in self.cells:
            if c.outcome == "skipped":
                skipped[c.why] = skipped.get(c.why, 0) + 1
        intended: dict[str, int] = {}
        for c in self.cells:
            if c.outcome == "intended":
                intended[c.why] = intended.get(c.why, 0) + 1
        compared = self.compared
        return {"cells": len(self.cells), "compared": compared, "passed": self.count("passed"),
                "at_return": self.count("at_return"), "intended": intended, "different": self.count("different"),
                "nondeterministic": self.count("nondeterministic"), "dropped": self.count("dropped"), "skipped": skipped,
                "passed_pct": round(100 * self.count("passed") / compared, 2) if compared else None,
                "as_shown_pct": round(100 * (self.count("passed") + self.count("at_return")) / compared, 2) if compared else None}


# -- the view a person (and the model) reads ---------------------------------------------------------------

def normalize(text: str) -> str:
    """Text with what differs between any two runs masked: addresses, prompts, the kernel's temp files."""
    text = ADDRESS.sub("0x?", text)
    text = TEMPFILE.sub("<cell>", text)
    text = PROMPT.sub(lambda m: m.group(1) + "[?]", text)
    lines = [line.rstrip() for line in text.split("\n")]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip("\n")


def view(content: list[dict[str, Any]]) -> str:
    """tool_result content blocks as one comparable text: text normalized, each image as its format."""
    parts = []
    for b in content:
        if b.get("type") == "image":
            parts.append(f"[image {b['source']['media_type']}]")
        else:
            parts.append(b.get("text", ""))
    return normalize("\n".join(parts))


def as_shown(outputs: list[dict[str, Any]], widgets: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A notebook cell's outputs as JupyterLab shows them (see the module's doc), ready for render.blocks; each
    widget with the tree of what it shows (`widget`, from the widgets' state), unless `widgets` is None."""
    shown: list[dict[str, Any]] = []
    for o in outputs:
        o = dict(o)
        kind = o.get("output_type")
        if kind == "stream":
            text = o.get("text", "")
            o["text"] = "".join(text) if isinstance(text, list) else text
            if shown and shown[-1].get("output_type") == "stream" and shown[-1].get("name") == o.get("name"):
                shown[-1] = {**shown[-1], "text": shown[-1]["text"] + o["text"]}
                continue
        elif kind in ("display_data", "execute_result"):
            data = {k: ("".join(v) if isinstance(v, list) and not k.endswith("json") else v)
                    for k, v in (o.get("data") or {}).items()}
            model = model_of(data)
            if model and widgets is not None and (shown_tree := tree(model, states(widgets))) is not None:
                o["widget"] = shown_tree
            if "image/svg+xml" in data and not any(m in data for m in ("image/png", "image/jpeg", "image/gif", "image/webp")):
                o["svg_png"] = ""  # the model gets the SVG as a PNG: an image, as a person sees one
            o["data"] = data
        elif kind == "error":
            o["traceback"] = list(o.get("traceback") or [])
        shown.append(o)
    return shown


def states(widgets: dict[str, Any]) -> Callable[[str], dict[str, Any] | None]:
    """The widgets' state as widgets.tree reads it (an Output widget's outputs as JupyterLab shows them)."""
    def get(model: str) -> dict[str, Any] | None:
        w = widgets.get(model)
        if not isinstance(w, dict) or not isinstance(w.get("state"), dict):
            return None
        state = {**w["state"], "_model_name": w.get("model_name") or w["state"].get("_model_name")}
        if isinstance(state.get("outputs"), list):
            state["outputs"] = as_shown(state["outputs"], None)
        return state

    return get


def notebook_view(outputs: list[dict[str, Any]], widgets: dict[str, Any]) -> str:
    return view(blocks(as_shown(outputs, widgets), [], []))


# -- running -----------------------------------------------------------------------------------------------

def plan(nb: dict[str, Any]) -> tuple[list[tuple[int, str]], list[Cell], str]:
    """The code cells to run (index, source) and the ones skipped; a notebook of another language runs none."""
    name = nb.get("_name", "")
    code = [(i, c) for i, c in enumerate(nb.get("cells", [])) if c.get("cell_type") == "code"]
    lang = (nb.get("metadata", {}).get("kernelspec", {}) or {}).get("language") or \
        (nb.get("metadata", {}).get("language_info", {}) or {}).get("name") or "python"
    if lang.lower() != "python":
        return [], [Cell(name, i, "skipped", f"a {lang} notebook") for i, _ in code], lang
    run, skipped = [], []
    for i, c in code:
        src = "".join(c.get("source", ""))
        tags = c.get("metadata", {}).get("tags", [])
        if "skip-execution" in tags:
            skipped.append(Cell(name, i, "skipped", "tagged skip-execution"))
        elif KILLS.search(src):
            skipped.append(Cell(name, i, "skipped", "kills the kernel"))
        elif ENDLESS.search(src):
            skipped.append(Cell(name, i, "skipped", "meant to be interrupted"))
        elif src.strip():
            run.append((i, src))
    return run, skipped, lang


class ReferenceKernelManager(AsyncKernelManager):
    """nbclient's kernel manager, with a client whose sends do not leave the wait for a cell's reply asleep: nbclient
    sends an Output widget's state on the shell channel while it waits there, and with jupyter_client's own client
    a reply that had just arrived then went unnoticed for the whole CELL_TIMEOUT (hands/launching/channel.py)."""

    @default("client_factory")
    def _waking_client(self) -> type:
        return WakingKernelClient


def reference_run(sources: list[str], cwd: Path) -> tuple[list[list[dict[str, Any]]], dict[str, Any], list[Snapshot]]:
    """Run the cells in a plain ipykernel with nbclient; each cell's outputs (as JupyterLab shows them), the
    widgets' state, and a snapshot of the whole notebook as it stood when each cell returned."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    payloads: dict[int, list[dict[str, Any]]] = {}
    snapshots: list[Snapshot] = []

    def outputs(i: int, cell: Any) -> list[dict[str, Any]]:
        return [dict(o) for o in cell.outputs] + payloads.get(i, [])

    def executed(cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        for p in (execute_reply or {}).get("content", {}).get("payload", []) or []:
            if p.get("source") == "page" and isinstance(p.get("data"), dict):
                payloads.setdefault(cell_index, []).append({"output_type": "display_data", "data": p["data"]})
            elif p.get("source") == "set_next_input":
                payloads.setdefault(cell_index, []).append({"output_type": "set_next_input", "text": p.get("text", "")})
        # nbclient applies display updates and Output widget captures to the cells they belong to as
        # they arrive: this is the notebook a person sees at the moment the call returns
        widgets = {k: {"model_name": st.get("_model_name"), "state": st}
                   for k, st in client.widget_state.items() if "_model_name" in st}
        snapshots.append(json.loads(json.dumps(
            ([outputs(i, c) for i, c in enumerate(nb.cells[:cell_index + 1])], widgets), default=str)))

    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}}, on_cell_executed=executed,
                            record_timing=False, kernel_manager_class=ReferenceKernelManager)
    client.execute()
    widgets = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    outs = [outputs(i, c) for i, c in enumerate(nb.cells)]
    return json.loads(json.dumps(outs)), json.loads(json.dumps(widgets)), snapshots


async def hands_run(sources: list[str], resources: Path | None, backend: str) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Run the cells through the workbench's hands; each cell's content blocks and stored observation."""
    from workbench.hands.factory import HandsFactory, HandsSettings

    with tempfile.TemporaryDirectory() as reg:
        async with HandsFactory(HandsSettings(backend=backend, pool_size=0, registry_dir=reg)) as factory:
            hands: Any = factory("fidelity", {"hands": {"timeout": CELL_TIMEOUT}}, None)
            await hands.execute("pass")
            workdir = hands.place.workdir
            if resources is not None and workdir is not None:
                for f in resources.iterdir():
                    if f.is_file():
                        shutil.copy(f, Path(workdir) / f.name)
            out = []
            for src in sources:
                obs = await hands.execute(src)
                out.append((obs.content_blocks(), obs.to_json()))
            await hands.shutdown()
            return out


def intended(obs: dict[str, Any], reference: str, model: str) -> str:
    """Why a difference is one docs/fidelity.md lists as intended, or "". A call that timed out is never one, even
    when its output was also cut: the difference may be the timeout's."""
    notes = obs.get("truncated") or []
    if any(str(n).startswith(TIMED_OUT.split("{", 1)[0]) for n in notes):
        return ""
    if any("truncated" in n or "dropped" in n for n in obs.get("truncated") or []) or "characters cut here: " in model:
        return "output cap"
    return ""


def at_return(snapshots: list[Snapshot], n: int) -> tuple[str, list[str]]:
    """What the notebook showed when call n returned: the cell's own view, and the lines that the call
    wrote elsewhere in the notebook (an update of an earlier cell's display, outputs an Output widget shown
    in an earlier cell captured), each output's new view, or what it gained when it only grew."""
    now_outs, now_widgets = snapshots[n]
    before_outs, before_widgets = snapshots[n - 1] if n else ([], {})
    elsewhere: list[str] = []
    for k, before_cell in enumerate(before_outs):
        for i, o in enumerate(now_outs[k]):
            new = lines(notebook_view([o], now_widgets))
            old = lines(notebook_view([before_cell[i]], before_widgets)) if i < len(before_cell) else []
            if new != old:
                elsewhere += new[len(old):] if new[:len(old)] == old else new
    return notebook_view(now_outs[n], now_widgets), elsewhere


# the line before what a call changed of an earlier call's output (render.updated): it names the output, the
# notebook shows the change in that output
UPDATE_LINE = re.compile(r"^ *\[(?:display .* from .* is now|the \w+ widget from .* (?:is now|now also shows)):\]$")


def lines(view_text: str) -> list[str]:
    return [line for line in view_text.split("\n") if line != "(no output)" and not UPDATE_LINE.match(line)]


def shown_at_return(own: str, elsewhere: list[str], model: str) -> bool:
    """The model read what the notebook showed when the call returned: the cell's own lines in their order,
    besides them no line but those the call wrote elsewhere in the notebook (each at most as often), and every
    line it wrote elsewhere at least once (a new display with a shown id is its own notice of the update)."""
    mine, got = lines(own), lines(model)
    it = iter(got)
    if not all(line in it for line in mine):  # the cell's own lines, in order
        return False
    extra = Counter(got) - Counter(mine)
    return not extra - Counter(elsewhere) and set(elsewhere) <= set(got)


def compare_notebook(nb: dict[str, Any], resources: Path | None, backend: str) -> list[Cell]:
    name = nb.get("_name", "")
    run, skipped, _ = plan(nb)
    cells = list(skipped)
    if not run:
        return cells
    sources = [s for _, s in run]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for d in (a, b):
            if resources is not None:
                for f in resources.iterdir():
                    if f.is_file():
                        shutil.copy(f, Path(d) / f.name)
        first, widgets, snaps = reference_run(sources, Path(a))
        second, widgets2, snaps2 = reference_run(sources, Path(b))
    got = asyncio.run(hands_run(sources, resources, backend))
    for n, ((index, _), ref, ref2, (content, obs)) in enumerate(zip(run, first, second, got, strict=True)):
        r, r2, m = notebook_view(ref, widgets), notebook_view(ref2, widgets2), view(content)
        moment, moment2 = at_return(snaps, n), at_return(snaps2, n)
        if r != r2 or moment != moment2:
            cells.append(Cell(name, index, "nondeterministic", "", r, m))
        elif IDLE_NEVER_CAME.note in (obs.get("truncated") or []):
            cells.append(Cell(name, index, "dropped", "ZMQ dropped output before the hands read it", r, m))
        elif r == m:
            cells.append(Cell(name, index, "passed"))
        elif shown_at_return(*moment, m):
            cells.append(Cell(name, index, "at_return", "as the notebook showed it when the call returned", r, m))
        elif why := intended(obs, r, m):
            cells.append(Cell(name, index, "intended", why, r, m))
        else:
            cells.append(Cell(name, index, "different", "", r, m))
    return sorted(cells, key=lambda c: c.index)


def run_corpus(directory: Path, backend: str) -> Report:
    report = Report()
    resources = directory / "resources"
    for path in sorted(directory.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        nb["_name"] = path.name
        nb = copy.deepcopy(nb)
        try:
            report.cells += compare_notebook(nb, resources if resources.is_dir() else None, backend)
        except Exception as e:  # a notebook the reference cannot run at all: say so, and go on
            report.cells.append(Cell(path.name, -1, "skipped", f"could not run: {type(e).__name__}: {str(e)[:200]}"))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__.split("\n")[0])
    p.add_argument("directory", type=Path, help="a folder of .ipynb files (and resources/)")
    p.add_argument("--backend", default="sandbox", choices=("sandbox", "local"))
    p.add_argument("--json", type=Path, help="write every cell's outcome here")
    p.add_argument("-v", "--verbose", action="store_true", help="show both views of each differing cell")
    args = p.parse_args(argv)
    report = run_corpus(args.directory, args.backend)
    s = report.summary()
    print(f"cells: {s['cells']}  compared: {s['compared']}  identical to the finished notebook: {s['passed']} "
          f"({s['passed_pct']} %)  as the notebook showed them when the call returned: {s['at_return']}")
    print(f"as the notebook shows them (identical + when the call returned): {s['as_shown_pct']} %  "
          f"intended differences: {sum(s['intended'].values())} {s['intended']}  different: {s['different']}  "
          f"nondeterministic: {s['nondeterministic']}  dropped by ZMQ: {s['dropped']}  skipped: {sum(s['skipped'].values())}")
    for c in report.cells:
        if c.outcome in ("different", "intended") or (args.verbose and c.outcome in ("nondeterministic", "at_return")):
            print(f"\n--- {c.notebook} cell {c.index}: {c.outcome} {c.why}")
            if args.verbose or c.outcome == "different":
                print("notebook shows:\n" + c.reference[:1500] + "\nmodel reads:\n" + c.model[:1500])
    if args.json:
        args.json.write_text(json.dumps({"summary": s, "cells": [c.__dict__ for c in report.cells]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
