"""Write tests/file_seconds.json from a test run's `--durations=0` report: the seconds each test file took
(its tests' setup, call and teardown), which the suite's conftest sorts files by so that the longest start first.

    PYTEST_ADDOPTS=--durations=0 bash .ci/run > ci.log 2>&1; python scripts/file_seconds.py ci.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:call|setup|teardown) +(tests/[^:\s]+\.py)::")
OUT = Path(__file__).resolve().parent.parent / "tests" / "file_seconds.json"


def file_seconds(lines: list[str]) -> dict[str, int]:
    seconds: dict[str, float] = defaultdict(float)
    for line in lines:
        if m := LINE.match(line):
            seconds[m.group(2)] += float(m.group(1))
    return {f: round(s) for f, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    found = file_seconds(Path(argv[0]).read_text(errors="replace").splitlines())
    if not found:
        print(f"{argv[0]}: no --durations=0 lines in it", file=sys.stderr)
        return 1
    OUT.write_text(json.dumps(found, indent=1) + "\n")
    print(f"wrote {OUT.name}: {len(found)} files, {sum(found.values()):,} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
