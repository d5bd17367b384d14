"""Evals: task sets, verifiers in hands of their own, outcome mode, runs and their report (docs/evals.md)."""

from ..plugins.hands import Verdict
from ..plugins.settings import Prices
from .attempt import attempt_id
from .report import report_html, report_panel, summary, wilson
from .results import COLUMNS, results, runs
from .runner import EvalRun
from .stats import Comparison, compare, pass_at_k, reduce_epochs
from .tasks import Task, TaskLimits, Verifier, load_tasks, task_from_json, task_to_json

__all__ = ["COLUMNS", "Comparison", "EvalRun", "Prices", "Task", "TaskLimits", "Verdict", "Verifier", "attempt_id",
           "compare", "load_tasks", "pass_at_k", "reduce_epochs", "report_html", "report_panel", "results", "runs",
           "summary", "task_from_json", "task_to_json", "wilson"]
