"""Statistics over a run's DataFrame: reducers over epochs and the paired comparison, each against a reference
computed here by hand (enumeration, a bootstrap written again with numpy, hand-computed exact McNemar values)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from workbench.errors import ConfigError
from workbench.evals import compare, pass_at_k, reduce_epochs, report_html
from workbench.evals.cli import print_summary
from workbench.evals.results import frame

from evalsupport import reference_bootstrap


def row(task, model, epoch, outcome, score=None, tries=1):
    graded = outcome in ("pass", "fail")
    return {"run": "r", "task": task, "model": model, "epoch": epoch, "outcome": outcome,
            "passed": (outcome == "pass") if graded else None,
            "score": score if score is not None else (float(outcome == "pass") if graded else None),
            "turns": 1, "tool_calls": 0, "input_tokens": 1, "output_tokens": 1, "cost": 0.0, "wall_s": 1.0,
            "session_id": f"{task}-{model}-{epoch}", "reason": outcome, "tries": tries}


def one_epoch(a: list[str], b: list[str]):
    """Two models over the same tasks, one epoch each: a[i] and b[i] are task i's outcomes."""
    return frame([row(f"t{i}", "A", 1, x) for i, x in enumerate(a)] + [row(f"t{i}", "B", 1, x) for i, x in enumerate(b)])


def test_pass_at_k_is_the_chance_that_k_epochs_drawn_without_replacement_hold_a_pass():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                outcomes = [True] * c + [False] * (n - c)
                draws = list(itertools.combinations(outcomes, k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert math.isnan(pass_at_k(2, 1, 3))


def test_reducers_count_only_graded_epochs():
    df = frame([row("t1", "A", 1, "pass"), row("t1", "A", 2, "fail"), row("t1", "A", 3, "pass"),
                row("t1", "A", 4, "error", tries=3),
                row("t2", "A", 1, "pass"), row("t2", "A", 2, "fail"), row("t2", "A", 3, None),
                row("t3", "A", 1, "error"), row("t3", "B", 1, "fail")])

    def values(how, k=1):
        out = reduce_epochs(df, how, k)
        return {(r["task"], r["model"]): (r["n"], r["c"], r["value"]) for r in out.to_dict("records")}

    mean = values("mean")
    assert mean[("t1", "A")] == (3, 2, pytest.approx(2 / 3)) and mean[("t2", "A")] == (2, 1, 0.5)
    assert mean[("t3", "A")][:2] == (0, 0) and math.isnan(mean[("t3", "A")][2])  # errors only: nothing graded
    assert mean[("t3", "B")] == (1, 0, 0.0)
    assert values("pass@k", 2)[("t1", "A")][2] == pytest.approx(1.0)  # C(1, 2) = 0: any two epochs hold a pass
    assert values("pass@k", 1)[("t1", "A")][2] == pytest.approx(2 / 3)
    assert math.isnan(values("pass@k", 3)[("t2", "A")][2])  # two graded epochs cannot estimate pass@3
    majority = values("majority")
    assert (majority[("t1", "A")][2], majority[("t2", "A")][2]) == (1.0, 0.0)  # a tie is not a majority
    top = values("max")
    assert (top[("t1", "A")][2], top[("t2", "A")][2], top[("t3", "B")][2]) == (1.0, 1.0, 0.0)


@pytest.mark.parametrize("how, k", [("median", 1), ("pass@k", 0), ("pass@k", 1.5), ("pass@k", True), ("mean", -1)])
def test_a_bad_reducer_or_k_is_refused(how, k):
    with pytest.raises(ConfigError, match="reducer|k must be"):
        reduce_epochs(one_epoch(["pass"], ["pass"]), how, k)


def test_the_interval_is_a_paired_bootstrap_over_tasks_of_per_task_means():
    # two epochs each; errors are left out of a task's mean; t4 has only errors for A, so it is not shared
    rows = []
    for i, (a, b) in enumerate([("pf", "pp"), ("ff", "pf"), ("pp", "pp"), ("fe", "pp"), ("ee", "pp"), ("pf", "ff")]):
        rows += [row(f"t{i}", "A", e + 1, {"p": "pass", "f": "fail", "e": "error"}[x]) for e, x in enumerate(a)]
        rows += [row(f"t{i}", "B", e + 1, {"p": "pass", "f": "fail", "e": "error"}[x]) for e, x in enumerate(b)]
    c = compare(frame(rows), "A", "B")
    diffs = np.array([1 - 0.5, 0.5 - 0, 1 - 1, 1 - 0, 0 - 0.5])  # t0, t1, t2, t3 (A: one graded epoch), t5
    low, high = reference_bootstrap(diffs)
    assert (c.n, c.wins, c.losses) == (5, 3, 1)
    assert c.estimate == pytest.approx(diffs.mean())
    assert (c.low, c.high) == (pytest.approx(low), pytest.approx(high))
    assert compare(frame(rows), "A", "B") == c  # a fixed seed: the same frame gives the same interval
    assert compare(frame(rows), "A", "B", seed=1) != c


def test_the_verdict_needs_the_exact_test_too():
    # one epoch: the sign test over discordant tasks is the exact McNemar test; 7 against 1 gives
    # p = 2 (C(8,0) + C(8,1)) / 2^8 = 18/256, above 0.05, although the bootstrap interval lies above 0
    c = compare(one_epoch(["fail"] * 7 + ["pass"] + ["pass", "fail"], ["pass"] * 7 + ["fail"] + ["pass", "fail"]), "A", "B")
    assert (c.wins, c.losses, c.n) == (7, 1, 10)
    assert c.p == pytest.approx(18 / 256)
    assert c.low > 0 and c.verdict == "no difference shown"
    # 12 against 0 over 15 tasks: p = 2 / 2^12
    better = compare(one_epoch(["fail"] * 12 + ["pass"] * 3, ["pass"] * 15), "A", "B")
    assert better.p == pytest.approx(2 / 4096) and better.low > 0
    assert better.verdict == "B is better than A at 95 %"
    worse = compare(one_epoch(["pass"] * 15, ["fail"] * 12 + ["pass"] * 3), "A", "B")
    assert worse.high < 0 and worse.verdict == "A is better than B at 95 %"


def test_no_shared_tasks_is_a_clear_error():
    df = frame([row("t1", "A", 1, "pass"), row("t2", "B", 1, "pass"), row("t3", "A", 1, "error"),
                row("t3", "B", 1, "pass")])
    with pytest.raises(ConfigError, match="no graded task in common"):
        compare(df, "A", "B")
    with pytest.raises(ConfigError, match="no graded task in common"):
        compare(df, "A", "nobody")
    with pytest.raises(ConfigError, match="itself"):
        compare(df, "A", "A")
    with pytest.raises(ConfigError, match="confidence"):
        compare(df, "A", "B", confidence=float("nan"))


def test_all_ties_and_one_task_show_no_difference():
    ties = compare(one_epoch(["pass", "fail", "pass"], ["pass", "fail", "pass"]), "A", "B")
    assert (ties.estimate, ties.low, ties.high, ties.p) == (0.0, 0.0, 0.0, 1.0)
    assert ties.verdict == "no difference shown"
    one = compare(one_epoch(["fail"], ["pass"]), "A", "B")
    assert (one.n, one.estimate, one.wins, one.p) == (1, 1.0, 1, 1.0)
    assert one.verdict == "no difference shown"  # one task won is no evidence


def test_non_finite_scores_do_not_change_the_comparison():
    outcomes = (["fail"] * 12 + ["pass"] * 3, ["pass"] * 14 + ["fail"])
    clean = compare(one_epoch(*outcomes), "A", "B")
    df = one_epoch(*outcomes)
    df["score"] = [math.inf, -math.inf, math.nan] * 10
    assert compare(df, "A", "B") == clean
    assert reduce_epochs(df, "mean")["value"].tolist() == reduce_epochs(one_epoch(*outcomes), "mean")["value"].tolist()


def test_the_report_and_the_cli_compare_each_model_with_the_first(capsys):
    hostile = "B<i>x</i>"
    df = frame([row(f"t{i}", "A", 1, "fail") for i in range(12)] + [row(f"t{i}", hostile, 1, "pass") for i in range(12)]
               + [row("t0", "C", 1, "error")])
    html = report_html(df)
    assert "paired comparison" in html and "B&lt;i&gt;x&lt;/i&gt; − A" in html and "<i>x" not in html
    assert "B&lt;i&gt;x&lt;/i&gt; is better than A at 95 %" in html
    assert "models &#x27;A&#x27; and &#x27;C&#x27; have no graded task in common" in html
    assert "paired comparison" not in report_html(df[df["model"] == "A"])
    print_summary(df)
    out = capsys.readouterr().out
    assert "B<i>x</i> − A: +100% (95% CI +100% to +100%, 12 task(s): 12 won, 0 lost): B<i>x</i> is better than A at 95 %" in out
    assert "no graded task in common" in out
