"""Run the benchmarks: `python -m bench [--quick] [--out FILE.json] [--write-docs] [--only a,b]`.

Each section runs both sides of its comparisons in this one process run and
reports p50 / p95 over repeated trials and their ratio. Targets are printed as
met / not met and never fail the run. A section whose part of the product is
missing is skipped with the reason; a section that breaks is reported as an
error (and the run exits non-zero, so CI notices).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from .common import Context, Section, machine
from .report import GOAL_SECTIONS, markdown, write_docs

SECTIONS = [
    ("first_response", "bench.first_response"),
    ("recovery", "bench.recovery"),
    ("hands_scale", "bench.hands_scale"),
    ("tool_round_trip", "bench.roundtrip"),
    ("log", "bench.logbench"),
    ("logscale", "bench.logscale"),
    ("scale", "bench.scale"),
    ("harness", "bench.harness"),
    ("start", "bench.start"),
    ("dreaming", "bench.dreaming"),
    ("evals", "bench.evals"),
    ("delegate", "bench.delegate"),
]

REPO = Path(__file__).resolve().parent.parent
# main before issue 24 (the harness at the floor): what --write-docs compares the goals with
BEFORE = "346d4dbccd99fba78cca5b26450aec7fe004bf08"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description="Benchmark the workbench against its alternatives.")
    p.add_argument("--quick", action="store_true", help="tiny trial counts (CI: keeps the suite working, says nothing about speed)")
    p.add_argument("--out", metavar="FILE.json", help="write the results as JSON here")
    p.add_argument("--write-docs", action="store_true", help="regenerate docs/benchmarks.md (full mode only)")
    p.add_argument("--only", metavar="A,B", help=f"run only these sections: {', '.join(k for k, _ in SECTIONS)}")
    p.add_argument("--before", metavar="REF", help="also measure the goals on the product code of git REF, in this "
                   f"run, with this benchmark code: the `before` column (with --write-docs: {BEFORE}, the code before "
                   "issue 24; `none` for no such column)")
    args = p.parse_args(argv)
    if args.before is None and args.write_docs:
        args.before = BEFORE
    if args.before == "none":
        args.before = None
    if args.write_docs and args.quick:
        p.error("--write-docs needs full mode: quick-mode figures are too few to publish")
    keys = {k for k, _ in SECTIONS}
    if args.only:
        unknown = set(args.only.split(",")) - keys
        if unknown:
            p.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(k for k, _ in SECTIONS)}")
    return args


async def run_section(key: str, module: str, ctx: Context) -> Section:
    t0 = time.perf_counter()
    try:
        sec = await importlib.import_module(module).run(ctx)
    except Exception as e:  # one broken benchmark must not hide the others' figures
        traceback.print_exc()
        sec = Section(key, key, status="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    sec.seconds = round(time.perf_counter() - t0, 1)
    return sec


async def run_all(args: argparse.Namespace, tmp: Path) -> dict:
    ctx = Context(quick=args.quick, tmp=tmp)
    wanted = set(args.only.split(",")) if args.only else None
    result = {
        "mode": "quick" if args.quick else "full",
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench" + (" --quick" if args.quick else ""),
        "machine": machine(),
        "sections": {},
    }
    for key, module in SECTIONS:
        if wanted is not None and key not in wanted:
            continue
        print(f"[bench] {key} ...", file=sys.stderr, flush=True)
        sec = await run_section(key, module, ctx)
        print(f"[bench] {key}: {sec.status} in {sec.seconds} s{': ' + sec.reason if sec.reason else ''}", file=sys.stderr, flush=True)
        result["sections"][key] = sec.to_json()
    if args.before:
        print(f"[bench] the goals on {args.before} ...", file=sys.stderr, flush=True)
        result["before"] = await asyncio.to_thread(run_before, args.before, args, tmp)
    if hasattr(os, "getloadavg"):
        result["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def run_before(ref: str, args: argparse.Namespace, tmp: Path) -> dict:
    """The goal sections run on the product code of `ref` (a copy of its tree from `git archive`, first on the
    path), with this benchmark code: {"ref", "sections"} (or {"ref", "error"})."""
    import subprocess

    tree, link = tmp / "before-tree", tmp / "before-bench"
    tree.mkdir()
    link.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    except subprocess.CalledProcessError as e:
        return {"ref": ref, "error": (e.stderr or b"").decode(errors="replace").strip()[-300:]}
    (link / "bench").symlink_to(REPO / "bench")  # this benchmark code; `workbench` comes from the old tree
    wanted = set(args.only.split(",")) if args.only else {k for k, _ in SECTIONS}
    only = ",".join(k for k in GOAL_SECTIONS if k in wanted)
    out = tmp / "before.json"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "bench", "--only", only, "--out", str(out)] + (["--quick"] if args.quick else [])
    proc = subprocess.run(cmd, cwd=link, env=env, capture_output=True, text=True)
    if not out.exists():
        return {"ref": ref, "error": proc.stderr.strip()[-300:]}
    return {"ref": ref, "sections": json.loads(out.read_text())["sections"]}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # so asyncio cancels the sections and their finally blocks stop kernels and servers


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
        tmp_path = Path(tmp)
        # kernels' connection files and the hands registry go to a directory of our own
        os.environ["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
        result = asyncio.run(run_all(args, tmp_path))
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"[bench] wrote {args.out}", file=sys.stderr)
    if args.write_docs:
        path = REPO / "docs" / "benchmarks.md"
        write_docs(result, path)
        print(f"[bench] wrote {path}", file=sys.stderr)
    return 1 if any(s["status"] == "error" for s in result["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
