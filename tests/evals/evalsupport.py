"""What several evals tests share: a host on a temporary DuckDB file, the `eval_results` view's rows, the check
that the DataFrame and the view agree, and a paired bootstrap written again as the comparison's reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workbench.evals.results import COLUMNS
from workbench.hands.factory import HandsSettings
from workbench.host import Host


def open_host(tmp_path: Path, backend: str = "sandbox", memory_mb: int = 4096, **kw: Any) -> Any:
    """A started host on a DuckDB file in `tmp_path` (no pooled kernel; `backend` local: kernels see the test's files)."""
    return Host.open(tmp_path / "wb.duckdb", hands=HandsSettings(backend=backend, pool_size=0, memory_mb=memory_mb,
                                                                  registry_dir=str(tmp_path / "kernels")), **kw)


def sql_rows(host: Any, run: str) -> list[dict[str, Any]]:
    q = host.log.query("SELECT * FROM eval_results WHERE run = ? ORDER BY run, task, model, epoch", [run])
    return [dict(zip(q.columns, r)) for r in q.rows]


def assert_frame_matches_sql(df: Any, rows: list[dict[str, Any]]) -> None:
    assert list(df.columns) == list(COLUMNS) and len(df) == len(rows)
    py = sorted(df.to_dict("records"), key=lambda r: (r["task"], r["model"], r["epoch"]))
    for a, b in zip(py, rows):
        for col in COLUMNS:
            if col in ("wall_s", "cost", "score") and a[col] is not None and b[col] is not None:
                assert a[col] == pytest.approx(b[col], abs=1e-6), col
            elif a[col] != a[col] or a[col] is None:  # NaN / None: missing on both sides
                assert b[col] is None or b[col] != b[col], (col, a, b)
            else:
                assert a[col] == b[col], (col, a, b)


def reference_bootstrap(diffs: Any, seed: int = 0, resamples: int = 10_000, confidence: float = 0.95) -> Any:
    """The percentile bootstrap interval of the mean of `diffs`, one resample at a time (the reference for compare)."""
    rng = np.random.default_rng(seed)
    means = np.array([diffs[rng.integers(0, len(diffs), len(diffs))].mean() for _ in range(resamples)])
    return np.percentile(means, [50 * (1 - confidence), 50 * (1 + confidence)])
