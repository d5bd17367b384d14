"""Statistics over an eval run's DataFrame: reducers over epochs and a paired comparison of two models.

Only graded attempts count (outcome `pass` or `fail`): an error is something outside the model, so it is in
neither n nor c, and a row still running is not graded yet. The comparison pairs tasks, not attempts: each
model's pass rate on a task is its mean over that task's graded epochs, and B − A is averaged over the tasks
both models have a graded epoch of. Its interval is a percentile bootstrap over those tasks with a fixed seed
(the same frame gives the same interval); because that interval is too narrow on a few tasks (three tasks all
won by B give [1, 1]), the verdict also asks an exact two-sided sign test over the tasks where the models
differ (at one epoch, the exact McNemar test) to reject at the same level (docs/evals.md#comparing-two-models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..plugins.errors import ConfigError

REDUCERS = ("mean", "pass@k", "majority", "max")
RESAMPLES = 10_000


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n graded epochs of which c passed: 1 - C(n-c, k) / C(n, k) (nan if n < k)."""
    if n < k:
        return math.nan
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def graded_counts(df: Any) -> Any:
    """Per (task, model): n, the graded epochs (errors and unfinished rows left out), and c, those that passed."""
    import pandas as pd

    graded = df[df["outcome"].isin(("pass", "fail"))]
    counts = (graded.assign(c=graded["outcome"] == "pass").groupby(["task", "model"], sort=True)
              .agg(n=("c", "size"), c=("c", "sum")).reset_index())
    every = df[["task", "model"]].drop_duplicates()
    out = every.merge(counts, on=["task", "model"], how="left").fillna({"n": 0, "c": 0})
    return pd.DataFrame({"task": out["task"], "model": out["model"], "n": out["n"].astype(int),
                         "c": out["c"].astype(int)}).sort_values(["task", "model"]).reset_index(drop=True)


def _reduce(how: str, n: int, c: int, k: int) -> float:
    if n == 0:
        return math.nan
    if how == "mean":
        return c / n
    if how == "pass@k":
        return pass_at_k(n, c, k)
    if how == "majority":
        return float(c > n / 2)
    return float(c > 0)


def reduce_epochs(df: Any, how: str = "mean", k: int = 1) -> Any:
    """Per (task, model) its epochs reduced to one value (`mean`, `pass@k`, `majority` or `max`), with n and c."""
    if how not in REDUCERS:
        raise ConfigError(f"unknown reducer {how!r}: use one of {', '.join(REDUCERS)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be a whole number of at least 1, not {k!r}")
    out = graded_counts(df)
    out["value"] = [_reduce(how, n, c, k) for n, c in zip(out["n"], out["c"], strict=True)]
    return out


@dataclass(frozen=True)
class Comparison:
    """B − A in pass rate over the tasks both models have graded epochs of, with its interval and verdict."""

    a: str
    b: str
    n: int  # tasks in the comparison
    estimate: float  # mean over those tasks of B's pass rate minus A's
    low: float
    high: float
    wins: int  # tasks where B's rate is higher
    losses: int  # tasks where A's rate is higher
    p: float  # exact two-sided sign test over wins and losses
    confidence: float

    @property
    def verdict(self) -> str:
        """One line: which model is better at this confidence, or that no difference was shown."""
        level = f"{self.confidence:.0%}".replace("%", " %")
        alpha = 1 - self.confidence
        if self.low > 0 and self.p < alpha:
            return f"{self.b} is better than {self.a} at {level}"
        if self.high < 0 and self.p < alpha:
            return f"{self.a} is better than {self.b} at {level}"
        return "no difference shown"


def sign_test(wins: int, losses: int) -> float:
    """The exact two-sided sign test's p-value of wins against losses (1 when there are none)."""
    m = wins + losses
    tail = sum(math.comb(m, i) for i in range(min(wins, losses) + 1)) / 2**m
    return min(1.0, 2 * tail)


def bootstrap(diffs: Any, confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `diffs`, resampled with `numpy.random.default_rng(seed)`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def compare(df: Any, a: str, b: str, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0) -> Comparison:
    """Model b against model a over the tasks both have graded epochs of (a ConfigError when there are none)."""
    import numpy as np

    if not 0 < confidence < 1 or not math.isfinite(confidence):
        raise ConfigError(f"confidence must be between 0 and 1, not {confidence!r}")
    if resamples < 1:
        raise ConfigError(f"resamples must be at least 1, not {resamples!r}")
    if a == b:
        raise ConfigError(f"compare two different models, not {a!r} with itself")
    counts = graded_counts(df[df["model"].isin((a, b))])
    counts = counts[counts["n"] > 0]
    rate = counts.assign(rate=counts["c"] / counts["n"]).pivot(index="task", columns="model", values="rate")
    if a not in rate.columns or b not in rate.columns or rate.dropna().empty:
        raise ConfigError(f"models {a!r} and {b!r} have no graded task in common: nothing to compare "
                          "(errors and unfinished attempts are not graded)")
    shared = rate.dropna()
    diffs = (shared[b] - shared[a]).to_numpy(dtype=float)
    wins, losses = int((diffs > 0).sum()), int((diffs < 0).sum())
    low, high = bootstrap(diffs, confidence, resamples, seed)
    return Comparison(a, b, len(diffs), float(np.mean(diffs)), low, high, wins, losses, sign_test(wins, losses),
                      confidence)


def comparisons(df: Any) -> list[Comparison | str]:
    """Each model after the first (by name) against the first; a pair with nothing to compare is its error's text."""
    models = sorted(set(df["model"]))
    out: list[Comparison | str] = []
    for b in models[1:]:
        try:
            out.append(compare(df, models[0], b))
        except ConfigError as e:
            out.append(str(e))
    return out
