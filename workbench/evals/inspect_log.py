"""An eval run as Inspect AI eval logs: what `inspect view`, inspect_ai's reader and the tools around it open.

Inspect's log is one task × one model, so a run becomes one EvalLog per model: its attempts are the samples
(id: the task's id, epoch: the attempt's epoch), each with the attempt's transcript as Inspect's chat messages
(the system prompt, the user's messages, the assistant's turns with their tool calls, the tool results as the
model read them: text cut as the hands cut it, images as data URIs), the verifier's last verdict as the score
`verifier` (C or I, its 0-1 score and explanation beside), the agent's model usage, and an attempt that ended as
an error as a sample error (never scored), its earlier tries as `error_retries`. Nothing here runs code or reads
the log: the caller gives the rows and a reader of each attempt's events (a host's log, or the server's API).

inspect_ai is an optional dependency (the `inspect` extra): it is imported here only, and this module only by the
command and the notebook helper that export.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from ..plugins.errors import ConfigError
from ..plugins.text import parts, result_blocks
from .attempt import attempt_id

EventsOf = Callable[[str], Iterable[Any]]  # session id -> its events (Event objects or their JSON form)
SCORER = "verifier"
UNKNOWN_TIME = datetime.fromtimestamp(0, UTC)  # an event's time when its form holds none (malformed JSON)
SUFFIXES = (".eval", ".json")
SURROGATE = re.compile("[\ud800-\udfff]")
# our budgets as Inspect's limit types
LIMITS: Mapping[str, Literal["turn", "token", "time"]] = MappingProxyType({"turns": "turn", "tokens": "token", "time": "time"})


def require() -> None:
    """ConfigError, one line saying how to get it, when inspect_ai is not installed."""
    try:
        import inspect_ai  # noqa: F401
    except ImportError as e:
        raise ConfigError("exporting to Inspect needs inspect_ai: pip install 'jupyter-workbench[inspect]'") from e


def clean(value: Any) -> Any:
    """A JSON value whose strings Inspect can write: a lone surrogate (a kernel's undecodable bytes kept as
    surrogateescape, a half emoji cut) becomes U+FFFD; everything else, escape sequences included, stays."""
    if isinstance(value, str):
        return SURROGATE.sub("\ufffd", value)
    if isinstance(value, Mapping):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _ts(event: Any) -> str | None:
    ts = event.get("ts") if isinstance(event, Mapping) else getattr(event, "ts", None)
    if isinstance(ts, datetime):
        return ts.isoformat()
    return ts if isinstance(ts, str) else None


def _when(event: Any) -> datetime | None:
    ts = event.get("ts") if isinstance(event, Mapping) else getattr(event, "ts", None)
    if isinstance(ts, str):
        try:
            return datetime.fromisoformat(ts)
        except ValueError:
            return None
    return ts if isinstance(ts, datetime) else None


StopReason = Literal["stop", "max_tokens", "tool_calls", "content_filter", "unknown"]
STOPS: Mapping[str | None, StopReason] = MappingProxyType({
    None: "stop", "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "max_tokens", "tool_use": "tool_calls",
    "refusal": "content_filter"})


def stop_reason(stop: Any) -> StopReason:
    """A Messages API stop reason as Inspect's."""
    return STOPS.get(stop, "unknown") if isinstance(stop, str) or stop is None else "unknown"


def _content(blocks: Sequence[Any]) -> list[Any]:
    """Anthropic content blocks (an assistant's text and thinking, a tool result's text and images) as Inspect's."""
    from inspect_ai._util.content import ContentImage, ContentReasoning, ContentText

    out: list[Any] = []
    for b in blocks:
        if not isinstance(b, Mapping):
            continue
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            out.append(ContentText(text=clean(b["text"])))
        elif kind == "thinking":
            out.append(ContentReasoning(reasoning=clean(str(b.get("thinking", ""))), signature=b.get("signature")))
        elif kind == "redacted_thinking":
            out.append(ContentReasoning(reasoning=str(b.get("data", "")), redacted=True))
        elif kind == "image" and isinstance(b.get("source"), Mapping) and b["source"].get("type") == "base64":
            src = b["source"]
            out.append(ContentImage(image=f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"))
    return out


def transcript(events: Iterable[Any]) -> tuple[list[Any], dict[str, Any]]:
    """An attempt's events as Inspect chat messages, and what else they say: the final answer, the model's usage,
    the verdicts, the first and last times, the last stop reason and the harness's failures."""
    from inspect_ai.event import InfoEvent, ModelEvent, ToolEvent
    from inspect_ai.model import (
        ChatCompletionChoice,
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageTool,
        ChatMessageUser,
        GenerateConfig,
        ModelOutput,
    )
    from inspect_ai.tool import ToolCall, ToolCallError

    messages: list[Any] = []
    timeline: list[Any] = []  # the sample's events: a model call per assistant turn, a tool event per result
    calls: dict[str, Any] = {}  # tool_use id -> its ToolCall, for the tool event of its result
    seen: dict[str, Any] = {"answer": "", "usage": {}, "verdicts": [], "started": None, "finished": None, "model": None,
                            "stop": None, "failures": [], "prompt": None, "started_payload": {}, "finished_payload": {},
                            "events": timeline}
    for ev in events:
        _, kind, p = parts(ev)
        seen["started"] = seen["started"] or _ts(ev)
        seen["finished"] = _ts(ev) or seen["finished"]
        at = _when(ev) or UNKNOWN_TIME
        if kind == "session_created" and isinstance(p.get("system"), str) and p["system"]:
            messages.append(ChatMessageSystem(content=clean(p["system"])))
        elif kind == "user_message" and isinstance(p.get("text"), str):
            if seen["prompt"] is None:
                seen["prompt"] = clean(p["text"])
            messages.append(ChatMessageUser(content=clean(p["text"]), source="input" if len(messages) <= 1 else None))
        elif kind == "assistant_turn" and isinstance(p.get("message"), Mapping):
            m = p["message"]
            blocks = m.get("content") if isinstance(m.get("content"), list) else []
            tool_calls = [ToolCall(id=clean(str(b.get("id"))), function=clean(str(b.get("name"))),
                                   arguments=clean(b["input"]) if isinstance(b.get("input"), Mapping) else {})
                          for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_use"]
            content = _content(blocks)
            texts = [str(b.get("text")) for b in blocks if isinstance(b, Mapping) and b.get("type") == "text"]
            if texts:
                seen["answer"] = clean("\n".join(texts))
            seen["model"] = m.get("model") or seen["model"]
            seen["stop"] = m.get("stop_reason") or seen["stop"]
            name = clean(m.get("model")) if isinstance(m.get("model"), str) else None
            reply = ChatMessageAssistant(content=content or "", tool_calls=tool_calls or None, model=name, source="generate")
            u = p.get("usage") if isinstance(p.get("usage"), Mapping) else m.get("usage")
            turn: dict[str, int] = {}
            for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
                v = (u if isinstance(u, Mapping) else {}).get(key)
                if isinstance(v, int) and not isinstance(v, bool):
                    turn[key] = v
                    seen["usage"][key] = seen["usage"].get(key, 0) + v
            timeline.append(ModelEvent(
                model=name or "unknown", input=list(messages), tools=[], tool_choice="auto", config=GenerateConfig(),
                output=ModelOutput(model=name or "", choices=[ChatCompletionChoice(message=reply, stop_reason=stop_reason(
                    m.get("stop_reason")))], usage=_usage(turn) if turn else None), timestamp=at))
            messages.append(reply)
            calls.update({c.id: c for c in tool_calls})
        elif kind == "tool_result":
            blocks = result_blocks(p)
            content = _content(blocks)
            error = None
            if p.get("is_error"):
                text = "\n".join(c.text for c in content if getattr(c, "type", None) == "text")
                error = ToolCallError("unknown", text[:2000] or "the call failed")
            call_id = clean(str(p.get("tool_use_id")))
            messages.append(ChatMessageTool(content=content or "", tool_call_id=call_id,
                                            function=clean(str(p.get("name"))), error=error))
            call = calls.get(call_id)
            timeline.append(ToolEvent(id=call_id, function=clean(str(p.get("name"))),
                                      arguments=call.arguments if call is not None else {},
                                      result=content or "", error=error, timestamp=at))
        elif kind == "eval_verdict":
            verdict = clean({k: p.get(k) for k in ("turn", "passed", "score", "explanation", "kind")}
                            | {"error": (p.get("details") or {}).get("error")})
            seen["verdicts"].append(verdict)
            timeline.append(InfoEvent(source="workbench verifier", data=verdict, timestamp=at))
        elif kind == "eval_started":
            seen["started_payload"] = p
        elif kind == "eval_finished":
            seen["finished_payload"] = p
        elif kind in ("hands_died", "interrupted", "model_error", "turn_failed", "resumed"):
            failure = clean({"type": kind, **{k: v for k, v in p.items() if isinstance(v, (str, int, bool))}})
            seen["failures"].append(failure)
            timeline.append(InfoEvent(source=f"workbench {kind}", data=failure, timestamp=at))
    return messages, seen


def _usage(u: Mapping[str, int]) -> Any:
    from inspect_ai.model import ModelUsage

    i, o = u.get("input_tokens", 0), u.get("output_tokens", 0)
    return ModelUsage(input_tokens=i, output_tokens=o, total_tokens=i + o,
                      input_tokens_cache_write=u.get("cache_creation_input_tokens"),
                      input_tokens_cache_read=u.get("cache_read_input_tokens"))


def _target(task: Mapping[str, Any] | None) -> str:
    """What the verifier checks, as Inspect's target: its code, or its rubric ("" when the run's tasks are unknown)."""
    v = (task or {}).get("verifier") or {}
    return clean(str(v.get("code") or v.get("rubric") or ""))


def sample(row: Mapping[str, Any], events_of: EventsOf, task: Mapping[str, Any] | None) -> Any:
    """One attempt (its latest try; the earlier ones as error retries) as an Inspect EvalSample."""
    from inspect_ai._util.error import EvalError
    from inspect_ai.log import EvalSample, EvalSampleLimit, condense_sample
    from inspect_ai.log._log import EvalRetryError
    from inspect_ai.model import ModelOutput
    from inspect_ai.scorer import Score

    messages, seen = transcript(events_of(row["session_id"]))
    outcome = row["outcome"]
    scores = None
    if outcome in ("pass", "fail"):
        last = seen["verdicts"][-1] if seen["verdicts"] else {}
        scores = {SCORER: Score(value="C" if outcome == "pass" else "I", answer=seen["answer"] or None,
                                explanation=last.get("explanation"),
                                metadata=clean({"score": row["score"], "kind": last.get("kind")}))}
    retries = []
    for n in range(1, int(row["tries"] or 1)):
        sid = attempt_id(row["run"], row["task"], row["model"], row["epoch"], n)
        _, earlier = transcript(events_of(sid))
        why = earlier["finished_payload"].get("reason") or "error: the try did not finish"
        retries.append(EvalRetryError(message=clean(f"try {n} ({sid}): {why}"), traceback="", traceback_ansi=""))
    limit = None
    budget = LIMITS.get(str(row["reason"]))
    if budget is not None:
        limits = seen["started_payload"].get("limits") or {}
        value = limits.get({"turn": "turns", "token": "tokens", "time": "seconds"}[budget])
        limit = EvalSampleLimit(type=budget, limit=float(value) if isinstance(value, (int, float)) else 0.0)
    model = clean(f"workbench/{row['model']}")
    metadata = clean({"workbench": {k: row[k] for k in ("run", "model", "session_id", "outcome", "reason", "tries", "turns",
                                                         "tool_calls", "cost", "wall_s")}
                      | {"verdicts": seen["verdicts"], "failures": seen["failures"]}})
    return condense_sample(EvalSample(
        id=clean(str(row["task"])), epoch=int(row["epoch"]), input=seen["prompt"] or (task or {}).get("prompt") or "",
        target=_target(task), messages=messages,
        output=ModelOutput.from_content(model, seen["answer"], stop_reason=stop_reason(seen["stop"])),
        scores=scores, metadata=metadata,
        model_usage={model: _usage(seen["usage"])} if seen["usage"] else {},
        started_at=seen["started"], completed_at=seen["finished"] if outcome is not None else None,
        total_time=row["wall_s"] if isinstance(row["wall_s"], (int, float)) and math.isfinite(row["wall_s"]) else None,
        uuid=clean(str(row["session_id"])), limit=limit, error_retries=retries or None,
        events=seen["events"],
        error=EvalError(message=clean(str(row["reason"])), traceback="", traceback_ansi="") if outcome == "error" else None))


def eval_logs(rows: Sequence[Mapping[str, Any]], events_of: EventsOf, spec: Mapping[str, Any] | None = None) -> list[Any]:
    """The run's rows (latest tries, as `results` gives them) as one Inspect EvalLog per model, in model order;
    `spec`: the run's kept spec (runs.py), for the tasks' verifiers (the samples' targets)."""
    from importlib.metadata import PackageNotFoundError, version

    from inspect_ai.log import (
        EvalConfig,
        EvalDataset,
        EvalLog,
        EvalMetric,
        EvalPlan,
        EvalPlanStep,
        EvalResults,
        EvalScore,
        EvalSpec,
        EvalStats,
    )

    require()
    if not rows:
        raise ConfigError("the run has no attempts to export")
    tasks = {t.get("id"): t for t in (spec or {}).get("tasks") or [] if isinstance(t, Mapping)}
    try:
        packages = {"jupyter-workbench": version("jupyter-workbench")}
    except PackageNotFoundError:
        packages = {}
    logs = []
    for model in sorted({str(r["model"]) for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        samples = [sample(r, events_of, tasks.get(r["task"])) for r in mine]
        run = str(mine[0]["run"])
        starts = [s.started_at for s in samples if s.started_at]
        ends = [s.completed_at for s in samples if s.completed_at]
        graded = [r for r in mine if r["outcome"] in ("pass", "fail")]
        passed = sum(1 for r in graded if r["outcome"] == "pass")
        metrics = {"accuracy": EvalMetric(name="accuracy", value=passed / len(graded))} if graded else {}
        usage: dict[str, int] = {}
        for s in samples:
            for u in s.model_usage.values():
                usage["input_tokens"] = usage.get("input_tokens", 0) + u.input_tokens
                usage["output_tokens"] = usage.get("output_tokens", 0) + u.output_tokens
        finished = all(r["outcome"] is not None for r in mine)
        name = clean(f"workbench/{model}")
        logs.append(EvalLog(
            status="success" if finished else "started",
            eval=EvalSpec(
                eval_id=clean(f"{run}-{model}"), run_id=clean(run),
                created=min(starts) if starts else datetime.now().astimezone().isoformat(),
                task=clean(f"workbench-eval-{run}"), task_id=clean(run), task_display_name=clean(f"workbench eval {run}"),
                dataset=EvalDataset(name=clean(run), samples=len({r["task"] for r in mine}),
                                    sample_ids=sorted({clean(str(r["task"])) for r in mine})),
                model=name, config=EvalConfig(epochs=max(int(r["epoch"]) for r in mine)), packages=packages,
                metadata=clean({"workbench": {"run": run, "model": model}})),
            plan=EvalPlan(name="workbench", steps=[EvalPlanStep(solver="workbench-agent")]),
            results=EvalResults(total_samples=len(mine), completed_samples=sum(1 for r in mine if r["outcome"] is not None),
                                scores=[EvalScore(name=SCORER, scorer=SCORER, scored_samples=len(graded),
                                                  unscored_samples=len(mine) - len(graded), metrics=metrics)]),
            stats=EvalStats(started_at=min(starts) if starts else "", completed_at=max(ends) if finished and ends else "",
                            model_usage={name: _usage(usage)} if usage else {}),
            samples=samples))
    return logs


def targets(out: Path, models: Sequence[str]) -> list[Path]:
    """Where each model's log goes: `out` itself when it names an .eval or .json file (one model only), else a
    file per model in the directory `out`."""
    if out.suffix in SUFFIXES:
        if len(models) > 1:
            raise ConfigError(f"the run has {len(models)} models and an Inspect log holds one: give a directory "
                              "(a log per model goes in it)")
        return [out]
    paths: list[Path] = []
    for m in models:
        slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in m)[:100] or "model"
        n, name = 1, slug
        while out / f"{name}.eval" in paths:  # two names that differ only where a file name cannot (a:b and a-b)
            n, name = n + 1, f"{slug}-{n + 1}"
        paths.append(out / f"{name}.eval")
    return paths


def write_logs(rows: Sequence[Mapping[str, Any]], events_of: EventsOf, out: Path,
               spec: Mapping[str, Any] | None = None) -> list[Path]:
    """Write the run as Inspect logs at `out` (see `targets`); the paths written. A file there already is refused."""
    from inspect_ai.log import write_eval_log

    logs = eval_logs(rows, events_of, spec)
    paths = targets(out, [log.eval.metadata["workbench"]["model"] for log in logs])
    for p in paths:
        if p.exists():
            raise ConfigError(f"{p} exists already: give another name, or remove it first")
    if out.suffix not in SUFFIXES:
        out.mkdir(parents=True, exist_ok=True)
    for log, p in zip(logs, paths, strict=True):
        off_loop(write_eval_log, log, str(p), format="json" if p.suffix == ".json" else "eval")
    return paths


def off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call one of inspect_ai's synchronous functions. Called where an event loop runs in this thread (a notebook,
    an async caller), inspect_ai would patch asyncio for the whole process (nest_asyncio) to run its coroutine
    there: it runs in a thread of its own instead, where no loop runs, and this process's asyncio stays as it is."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args, **kwargs)
    with ThreadPoolExecutor(1, thread_name_prefix="inspect") as pool:
        return pool.submit(fn, *args, **kwargs).result()
