"""What a redaction costs: scrubbing a text from a log of N sessions, then rewriting the file.

    python -m bench.redaction [N]   (default 10,000 sessions; one in ten holds the text)

Prints the file size, the scrub time (tx.scrub in one transaction), the compact time (the file
copied into a fresh one and swapped in; writes wait for it) and whether any byte of the text is
left in the file. docs/events.md ("Redaction") quotes its figures.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from workbench.log import DuckDBLog

TEXT = "ghp_Qk7RmX2vN9sTz4LpW8yB3cJ6hF1dG5aE0uKi"


def main(n: int = 10_000) -> dict[str, float]:
    """Measure one scrub and one compact over n sessions; returns the figures."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.duckdb"
        log = DuckDBLog(path)
        try:
            for i in range(n):
                system = ("with " + TEXT if i % 10 == 0 else "") + " pad" * 300
                log.create_session(f"s{i}", title="t", model="m", payload={"system": system},
                                   then=[("user_message", {"text": "x" * 2000}),
                                         ("assistant_turn", {"message": {"content": [{"type": "text", "text": "y" * 2000}]}})])
            log.write(lambda tx: tx.execute("CHECKPOINT")).result()
            size = path.stat().st_size
            start = time.perf_counter()
            touched = log.write(lambda tx: tx.scrub([TEXT], "[redacted]")).result()
            scrub = time.perf_counter() - start
            start = time.perf_counter()
            log.compact()
            compact = time.perf_counter() - start
        finally:
            log.close()
        left = path.read_bytes().count(TEXT.encode())
        out = {"sessions": n, "file_mb": size / 1e6, "sessions_changed": len(touched), "scrub_s": scrub,
               "compact_s": compact, "file_after_mb": path.stat().st_size / 1e6, "copies_left": left}
    print(f"{n:,} sessions, {out['file_mb']:.1f} MB: scrub {scrub:.2f} s ({len(touched):,} sessions changed), "
          f"compact {compact:.2f} s, {out['file_after_mb']:.1f} MB after, copies left {left}")
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
