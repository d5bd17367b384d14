"""The benchmark suite keeps working: `python -m bench --quick` runs every section and writes its JSON.

Quick mode asserts nothing about speed; this only checks that each section produced figures,
or says plainly why it was skipped.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SECTIONS = {"first_response", "recovery", "hands_scale", "tool_round_trip", "log", "logscale", "scale", "harness", "dreaming", "evals", "delegate"}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.slow
@pytest.mark.timeout(600)  # about a minute on a quiet machine; much more on a busy shared one
def test_quick_mode_reports_every_section(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "WORKBENCH_DB")}
    proc = subprocess.Popen([sys.executable, "-m", "bench", "--quick", "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=540)
    finally:
        if proc.poll() is None:  # timed out: SIGTERM lets the suite stop its kernels and servers
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "quick"
    m = result["machine"]
    assert m["cores"] and m["cpu"] and m["python"] and m["packages"]["duckdb"]
    assert set(result["sections"]) == SECTIONS
    for key, s in result["sections"].items():
        if s["status"] == "skipped":
            assert s["reason"], f"{key} was skipped without a reason"
            continue
        assert s["status"] == "ok", (key, s["reason"])
        assert s["rows"], f"{key} measured nothing"
        for r in s["rows"]:
            assert r["n"] >= 1 and _number(r["p50_ms"]) and _number(r["p95_ms"]), (key, r)
        for c in s["comparisons"]:
            assert _number(c["value"]), (key, c)
            assert c["target"] is None or isinstance(c["met"], bool), (key, c)
    # the table went to stdout, with the targets named
    assert "### Targets" in stdout and "| target | figure | met |" in stdout
