"""The order test files start in (tests/conftest.py): the seconds a CI run measured per file, read from its
`--durations=0` report by scripts/file_seconds.py."""

from __future__ import annotations

import json
from pathlib import Path

from scripts.file_seconds import file_seconds

REPO = Path(__file__).resolve().parent.parent


def test_a_durations_report_gives_each_files_seconds():
    report = ["30.50s call     tests/ui/test_a.py::test_one[x-1]", "1.25s setup    tests/ui/test_a.py::test_one[x-1]",
              "0.25s teardown tests/ui/test_a.py::test_one[x-1]", "100.00s call     tests/test_b.py::test_two",
              "12.00s call     tests/c.py::test_three", "(19 durations < 0.005s hidden.  Use -vv to show these durations.)",
              "9.0s call tests/evil.py", "garbage \xff line", "1e9s call     tests/x.py::t"]
    assert file_seconds(report) == {"tests/test_b.py": 100, "tests/ui/test_a.py": 32, "tests/c.py": 12}


def test_the_measured_files_exist():
    measured = json.loads((REPO / "tests" / "file_seconds.json").read_text())
    assert measured and all(isinstance(s, int) and s >= 0 for s in measured.values())
    gone = [f for f in measured if not (REPO / f).is_file()]
    assert gone == [], f"tests/file_seconds.json names files that are gone: {gone}; run scripts/file_seconds.py"
