"""Evals in JupyterLab (issue 28, item 5), in a real JupyterLab driven in headless Chromium: a running run's progress
moves in the sidebar's Evals tab; the report panel of a run of the example set with two scripted models shows the
counts the run's results give through Python (errors apart from failures), opens each attempt's transcript drawn by
the sidebar's chat, is reached by keyboard and follows the theme; and a run whose names carry markup stays text.
One page serves the module's tests, in order."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hostile import assert_control_runs, ran
from wbui import CHROMIUM, HOSTILE_EVAL, REPO, JupyterProcess, axe_violations, lab_api, loopback_page, open_sidebar, shot

from workbench.evals import Task, TaskLimits, Verifier, load_tasks, task_to_json
from workbench.evals.attempt import attempt_id
from workbench.evals.report import summary, wilson

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium (scripts/test.sh installs it)")

EXAMPLE = REPO / "examples" / "evals" / "basic.jsonl"
# Of the example set: a python verifier (kernels: the agent's and the check's) and a rubric graded by the attempt's own
# model, which the default scripted model cannot do (it answers the grading request with no JSON): an error.
PICKED = ("num-fib-30", "rubric-explain-median")
MODELS = ["scripted:eval", "scripted"]
# The call waits for a file the test puts in its workspace: the run is running, with nothing finished, until then.
GATE = Task("gate", "Wait for the go, then print six times seven.",
            Verifier.graded('The answer is "42".', model="scripted:grader"), limits=TaskLimits(turns=1),
            scripted=({"code": ["import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.1)\nprint(6 * 7)"],
                       "answer": "{output}"},))


@pytest.fixture(scope="module")
def page(browser, lab: JupyterProcess) -> Iterator[Any]:
    """One page for the module's tests (they go on from where the one before left it), loopback only."""
    with loopback_page(browser) as page:
        yield page


@pytest.fixture(scope="module")
def example_run(lab: JupyterProcess) -> str:
    """A run of the picked example tasks by both scripted models, started at once (the first test watches another)."""
    run = f"example-{uuid.uuid4().hex[:8]}"
    tasks = [t for t in load_tasks(EXAMPLE) if t.id in PICKED]
    assert [t.id for t in tasks] == list(PICKED)
    lab_api(lab, "POST", "evals", {"tasks": [task_to_json(t) for t in tasks], "models": MODELS, "run": run})
    return run


def evals_tab(page: Any, lab: JupyterProcess) -> Any:
    panel = open_sidebar(page, lab)
    panel.get_by_role("tab", name="Evals").click()
    return panel.locator(".jp-wb-evals")


def test_a_running_runs_progress_moves_in_the_sidebar(page, lab: JupyterProcess, example_run: str):
    run = f"gate-{uuid.uuid4().hex[:8]}"
    lab_api(lab, "POST", "evals", {"tasks": [task_to_json(GATE)], "models": MODELS, "run": run, "parallel": 1})
    tab = evals_tab(page, lab)
    row = tab.locator(f'.jp-wb-eval-run[data-run="{run}"]')
    # the run runs, its first attempt waits at the gate: nothing finished, and the sidebar says so
    row.wait_for(timeout=60_000)
    assert row.get_attribute("data-state") == "running"
    assert row.locator(".jp-wb-eval-counts").inner_text() == "0/2 finished · 0 passed · 0 failed · 0 errors"
    assert tab.locator(".jp-wb-eval-run").first.get_attribute("data-run") in (run, example_run)  # running ones first
    bar = row.locator("progress")
    assert (bar.get_attribute("value"), bar.get_attribute("max")) == ("0", "2")
    assert "0/2 finished" in bar.get_attribute("aria-label")
    shot(page, "evals-sidebar-running")
    # its report, opened from its entry while it runs: the gated attempt unfinished, its transcript live
    row.get_by_role("button", name=f"Open the report of run {run}").click()
    report = page.locator(".jp-wb-evalreport").filter(has=page.locator("h2", has_text=f"Eval run {run}"))
    status = report.locator(".jp-wb-eval-status")
    status.and_(page.locator("[data-state='running']")).wait_for(timeout=60_000)
    assert status.inner_text() == "running · 0/2 finished"
    gated = report.locator('.jp-wb-eval-mark[data-outcome="unfinished"]')
    gated.wait_for(timeout=120_000)
    assert gated.inner_text() == "…" and gated.get_attribute("aria-label") == "gate · scripted:eval · epoch 1: unfinished"
    gated.click()
    side = report.locator(".jp-wb-eval-transcript")
    side.locator(".jp-wb-tool.jp-mod-running").wait_for(timeout=120_000)  # the call waits at the gate
    workspace = lab.db.with_name(lab.db.name + ".evals") / run / attempt_id(run, "gate", "scripted:eval", 1) / "work"
    assert workspace.is_dir()
    (workspace / "go").write_text("")
    # the sidebar follows it to its end, by itself (it polls while a run runs), and so do the report and transcript
    page.wait_for_function("""(run) => {
        const li = document.querySelector(`#jp-workbench .jp-wb-eval-run[data-run="${run}"]`);
        return li && li.dataset.state !== 'running' && li.querySelector('progress').value === 2; }""",
                           arg=run, timeout=300_000)
    assert row.locator(".jp-wb-eval-counts").inner_text() == "2/2 finished · 1 passed · 1 failed · 0 errors"
    side.locator(".jp-wb-tool .jp-wb-stdout").filter(has_text="42").wait_for(timeout=60_000)
    side.locator(".jp-wb-note").filter(has_text="attempt ended: pass").wait_for(timeout=60_000)
    status.and_(page.locator("[data-state='done']")).wait_for(timeout=60_000)
    assert status.inner_text() == "done · 2/2 finished"
    assert report.locator('.jp-wb-eval-mark[data-outcome="pass"]').count() == 1
    assert report.locator('.jp-wb-eval-mark[data-outcome="fail"]').count() == 1
    listed = next(r for r in lab_api(lab, "GET", "evals")["runs"] if r["run"] == run)
    assert (listed["finished"], listed["passed"], listed["failed"], listed["errors"]) == (2, 1, 1, 0)


def _pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{round(x * 100)}%"


def test_the_report_shows_the_runs_counts_errors_apart_and_each_transcript(page, lab: JupyterProcess, example_run: str):
    from workbench.client import WorkbenchClient

    tab = page.locator("#jp-workbench .jp-wb-evals")
    row = tab.locator(f'.jp-wb-eval-run[data-run="{example_run}"]')
    row.wait_for(timeout=60_000)
    # from the sidebar's entry: the report in the main area
    row.get_by_role("button", name=f"Open the report of run {example_run}").click()
    report = page.locator(".jp-wb-evaltab .jp-wb-evalreport").filter(
        has=page.locator("h2", has_text=f"Eval run {example_run}"))
    report.wait_for()
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").filter(has_text=f"Eval {example_run}").wait_for()
    report.locator(".jp-wb-eval-status[data-state]:not([data-state='running'])").wait_for(timeout=600_000)

    # the counts are those of the run's results read through Python (the notebook client's DataFrame), by summary()
    client = WorkbenchClient(lab.url, lab.token)
    try:
        df = client.eval_results(example_run)
    finally:
        client.close()
    want = {s["model"]: s for s in summary(df)}
    assert set(want) == set(MODELS)
    for model, s in want.items():
        tr = report.locator(f'.jp-wb-eval-summary tbody tr[data-model="{model}"]')
        assert tr.locator("th").inner_text() == model
        cell = {c: tr.locator(f'td[data-col="{c}"]').inner_text() for c in
                ("passed", "failed", "errors", "rate", "ci", "retried", "unfinished")}
        assert cell["passed"] == f"{s['passed']}/{s['n']}" and cell["failed"] == str(s["failed"]), (model, cell)
        assert cell["errors"] == str(s["errors"]) and cell["retried"] == str(s["retried"]), (model, cell)
        assert cell["rate"] == _pct(s["rate"]) and cell["ci"] == f"{_pct(s['low'])}–{_pct(s['high'])}", (model, cell)
        assert cell["unfinished"] == "0", (model, cell)
        cost = report.locator(f'.jp-wb-eval-cost tbody tr[data-model="{model}"]')
        cell = {c: cost.locator(f'td[data-col="{c}"]').inner_text() for c in ("input_tokens", "output_tokens", "cost", "time")}
        assert cell == {"input_tokens": f"{s['input_tokens']:,}", "output_tokens": f"{s['output_tokens']:,}",
                        "cost": "not priced", "time": f"{s['mean_wall_s']:.1f} s"}, (model, cell)
        assert s["input_tokens"] > 0 and s["output_tokens"] > 0
    # what the run is: every example attempt passes with scripted:eval; the default scripted model fails the python
    # check and cannot grade the rubric: an error (after its retries), apart from the failure, out of the rate
    assert (want["scripted:eval"]["passed"], want["scripted:eval"]["n"]) == (2, 2)
    assert (want["scripted"]["passed"], want["scripted"]["failed"], want["scripted"]["errors"]) == (0, 1, 1)
    assert want["scripted"]["retried"] == 2 and (want["scripted"]["low"], want["scripted"]["high"]) == wilson(0, 1)
    # the paired comparison (two models): scripted:eval against scripted, on the one task both have graded
    paired = report.locator(".jp-wb-eval-paired tbody tr")
    assert paired.count() == 1
    assert paired.locator("th").inner_text() == "scripted:eval − scripted"
    assert paired.locator("td").nth(0).inner_text() == "+100%" and "1 (1 won, 0 lost)" in paired.inner_text()
    # the grid: a mark per attempt (its latest try), by outcome
    marks = report.locator(".jp-wb-eval-grid .jp-wb-eval-mark")
    assert marks.count() == len(df) == 4
    for r in df.to_dict("records"):
        mark = report.locator(f'.jp-wb-eval-mark[data-session="{r["session_id"]}"]')
        assert mark.get_attribute("data-outcome") == r["outcome"], r
        assert mark.inner_text() == {"pass": "✓", "fail": "✗", "error": "⚠"}[r["outcome"]]
        assert mark.get_attribute("aria-label").endswith(f": {r['outcome']}"), mark.get_attribute("aria-label")
    error = df[df.outcome == "error"].iloc[0]
    assert (error.task, error.model, error.tries) == ("rubric-explain-median", "scripted", 3)

    # a click opens the attempt's transcript, drawn by the sidebar's chat: its code, its output, the verdict
    passed = df[(df.task == "num-fib-30") & (df.model == "scripted:eval")].iloc[0]
    report.locator(f'.jp-wb-eval-mark[data-session="{passed.session_id}"]').click()
    side = report.locator(".jp-wb-eval-transcript")
    side.locator(".jp-wb-log .jp-wb-tool .jp-wb-stdout").filter(has_text="832040").wait_for(timeout=30_000)
    side.locator(".jp-wb-note").filter(has_text="verdict after turn 1: passed").wait_for()
    assert side.locator(".jp-wb-log .jp-wb-user").first.inner_text().startswith("What is the 30th Fibonacci number")
    assert side.locator("h3").inner_text() == "num-fib-30 · scripted:eval · epoch 1: pass"
    assert report.locator(f'.jp-wb-eval-mark[data-session="{passed.session_id}"]').get_attribute("aria-pressed") == "true"
    shot(page, "evals-report-light")
    # by keyboard: Tab reaches the marks, Enter opens one; the error's transcript says why there was no verdict
    err_mark = report.locator(f'.jp-wb-eval-mark[data-session="{error.session_id}"]')
    err_mark.focus()
    page.keyboard.press("Enter")
    side.locator(".jp-wb-note.jp-wb-error").filter(has_text="no verdict after turn 1").wait_for(timeout=30_000)
    side.locator(".jp-wb-note.jp-wb-error").filter(has_text="attempt ended: error").wait_for()
    assert side.locator("h3").inner_text() == "rubric-explain-median · scripted · epoch 1, try 3: error"
    assert side.locator(".jp-wb-log").get_attribute("data-session") == error.session_id
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("document.activeElement.classList.contains('jp-wb-eval-mark')")

    # JupyterLab's type scale and colours, in the light theme and the dark one
    def looks() -> dict[str, Any]:
        return report.evaluate("""(el) => {
            const v = n => getComputedStyle(document.body).getPropertyValue(n).trim();
            const probe = document.createElement('div');
            probe.style.color = v('--jp-success-color0'); probe.style.background = v('--jp-layout-color0');
            probe.style.fontSize = v('--jp-ui-font-size1'); probe.style.fontFamily = v('--jp-ui-font-family');
            document.body.append(probe);
            const want = getComputedStyle(probe);
            const out = {bg: [getComputedStyle(el).backgroundColor, want.backgroundColor],
                         pass: [getComputedStyle(el.querySelector('.jp-wb-eval-mark.jp-mod-pass')).color, want.color],
                         font: [getComputedStyle(el.querySelector('.jp-wb-eval-table')).fontSize, want.fontSize],
                         family: [getComputedStyle(el).fontFamily, want.fontFamily]};
            probe.remove();
            return out;
        }""")

    light = looks()
    assert all(a == b for a, b in light.values()), light
    panel = f"#jp-workbench-eval-{re.sub('[^A-Za-z0-9]', lambda m: f'_{ord(m[0]):04x}', example_run)} .jp-wb-evalreport"
    assert page.locator(panel).count() == 1
    assert axe_violations(page, panel) == []
    assert axe_violations(page, "#jp-workbench .jp-wb-evals") == []
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    page.locator("#jupyterlab-splash").wait_for(state="detached")
    page.wait_for_function("(bg) => getComputedStyle(document.querySelector('.jp-wb-evalreport')).backgroundColor !== bg",
                           arg=light["bg"][0])
    dark = looks()
    assert all(a == b for a, b in dark.values()) and dark["bg"] != light["bg"], dark
    assert axe_violations(page, panel) == []
    shot(page, "evals-report-dark")
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached")


def test_a_run_whose_names_carry_markup_stays_text(page, lab: JupyterProcess):
    h = HOSTILE_EVAL
    assert ran(page) is None
    # the palette's command with no run asks for one, listing the runs (their ids as text)
    page.evaluate("() => { window.jupyterapp.commands.execute('workbench:open-eval-report'); }")
    dialog = page.locator(".jp-Dialog")
    dialog.locator("select").wait_for()
    assert h["run"] in dialog.locator("select option").all_inner_texts()
    dialog.locator("select").select_option(label=h["run"])
    dialog.locator("button.jp-mod-accept").click()
    report = page.locator(".jp-wb-evaltab .jp-wb-evalreport").filter(
        has=page.locator("h2", has_text=f"Eval run {h['run']}"))
    report.wait_for()
    mark = report.locator(".jp-wb-eval-mark")
    mark.wait_for(timeout=30_000)
    assert report.locator(".jp-wb-eval-grid tbody th").inner_text() == h["task"]
    assert report.locator(".jp-wb-eval-grid thead th").nth(1).inner_text() == h["model"]
    assert report.locator('.jp-wb-eval-summary td[data-col="errors"]').inner_text() == "1"
    assert h["reason"] in mark.get_attribute("title")
    mark.click()
    side = report.locator(".jp-wb-eval-transcript")
    side.locator(".jp-wb-note").filter(has_text="attempt ended: error").wait_for(timeout=30_000)
    assert h["reason"] in side.inner_text() and h["task"] in side.locator("h3").inner_text()
    side.locator(".jp-wb-assistant").filter(has_text="done").wait_for()
    # the sidebar lists it too, its id as text
    tab = page.locator("#jp-workbench .jp-wb-evals")
    tab.locator(".jp-wb-eval-run-id").filter(has_text=h["run"]).wait_for(timeout=30_000)
    hostile_row = tab.locator(".jp-wb-eval-run").filter(has=page.locator(".jp-wb-eval-run-id", has_text=h["run"]))
    # a run no process runs, all of it finished: its state says so in a word (the API's `stopped`)
    assert hostile_row.get_attribute("data-state") == "stopped" and hostile_row.locator(".jp-wb-chip").inner_text() \
        .lower() == "finished"
    assert "1/1 finished · 0 passed · 0 failed · 1 error" == hostile_row.locator(".jp-wb-eval-counts").inner_text()
    assert page.locator(".jp-wb-evalreport iframe, .jp-wb-evalreport script, .jp-wb-evals svg[onload]").count() == 0
    assert ran(page) is None, ran(page)
    shot(page, "evals-report-hostile")
    # with a run id that names no run: the panel says so, once (it does not keep asking)
    page.evaluate("() => { window.jupyterapp.commands.execute('workbench:open-eval-report', {run: 'no-such-run'}); }")
    missing = page.locator(".jp-wb-evalreport").filter(has=page.locator("h2", has_text="Eval run no-such-run"))
    missing.locator(".jp-wb-banner").filter(has_text="There is no eval run no-such-run").wait_for()
    assert_control_runs(page)  # the check above would have seen a script that ran
    assert page.blocked == []
