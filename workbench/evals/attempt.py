"""One eval attempt in **outcome mode**: turns until the verifier passes or a budget is spent.

An attempt is an ordinary session (kind `eval`) whose id is derived from (run, task, model,
epoch), so it is created once however often a run is started. Its workspace is the session's
own, with the host's quota and a sandbox identity of its own, kept in the attempt's directory
(`config.hands.keep_dir`) so that it outlives the host: an attempt resumed by the next host
finds its files. The task's files are put in it before the first turn. After each turn the
verifier grades a copy of the workspace (verify.py) and its verdict is an `eval_verdict`
event; a failed verdict's explanation is the next user message, until the verdict passes
or the attempt's limits (turns, tokens, seconds) are spent. `eval_finished` closes it with
its outcome: `pass`, `fail`, or `error` when something the model did not cause cut a turn
off or kept the verifier from a verdict (faults.py); the run then tries it again, as a new
attempt of the same (task, model, epoch) (`Spec.retry`), and keeps this one as it ended.

Everything the loop decides is read back from the log, so an attempt cut off by a crash
goes on where it stopped: a turn the crash left open is closed (its started tool call
answered as interrupted, never re-run) and the attempt ends as an error; a turn without a
verdict is graded, a finished attempt is left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..plugins.hands import NoWorkspace, Verdict, python_verdict, write_file
from ..plugins.models import turn_state
from .faults import cut_off, verdict_error
from .tasks import Task
from .verify import rubric_verdict

FEEDBACK = ("A check of your work did not pass:\n\n{explanation}\n\n"
            "Fix it and answer again (your files are as you left them).")


def attempt_id(run: str, task: str, model: str, epoch: int, try_n: int = 1) -> str:
    """The session id of one attempt: the same (run, task, model, epoch, try) always names the same session."""
    key = f"{run}\0{task}\0{model}\0{epoch}" + (f"\0{try_n}" if try_n > 1 else "")  # a first try as before tries
    return "ev" + hashlib.sha256(key.encode()).hexdigest()[:14]


@dataclass(frozen=True)
class Spec:
    """What one attempt is: a try (1, then one more per error retried) of a task by a model in an epoch."""

    run: str
    task: Task
    model: str
    epoch: int
    try_n: int = 1

    @property
    def id(self) -> str:
        return attempt_id(self.run, self.task.id, self.model, self.epoch, self.try_n)

    def retry(self) -> Spec:
        """The next try of the same (task, model, epoch): a session and workspace of its own."""
        return replace(self, try_n=self.try_n + 1)


def final_answer(events: list[Any]) -> str:
    """The text of the last assistant turn."""
    for e in reversed(events):
        if e.type == "assistant_turn":
            return "\n\n".join(b.get("text", "") for b in e.payload["message"].get("content", []) if b.get("type") == "text")
    return ""


def usage_of(events: list[Any]) -> tuple[int, int]:
    """(input tokens, output tokens) of the agent's model calls."""
    ins = outs = 0
    for e in events:
        if e.type == "assistant_turn":
            u = e.payload.get("usage") or {}
            ins += int(u.get("input_tokens") or 0)
            outs += int(u.get("output_tokens") or 0)
    return ins, outs


class Attempt:
    """Runs one attempt to its `eval_finished` (see the module docstring)."""

    def __init__(self, host: Any, spec: Spec, workspace_root: Path, *, grader_model: str = "", price: Any = None):
        self.host, self.spec = host, spec
        self.dir = workspace_root / spec.run / spec.id
        self.workspace = self.dir / "work"  # where the hands mount the kept workspace (hands/quota.py)
        self.grader_model = grader_model
        self.price = price or (lambda model, i, o: 0.0)

    async def _append(self, type: str, payload: dict[str, Any], *more: tuple[str, dict[str, Any]]) -> None:
        """Append the event (and `more` after it) in one transaction."""
        sid = self.spec.id

        def write(tx: Any) -> None:
            for t, p in ((type, payload), *more):
                tx.append(sid, t, p)

        await self.host.log.awrite(write)

    def _create(self) -> None:
        """Create the session with its `eval_started` (the task's files go in before its first turn)."""
        s, brain = self.spec, self.host.brain
        config = {"eval": {"run": s.run, "task": s.task.id, "model": s.model, "epoch": s.epoch},
                  # nobody waits on an attempt's kernel: a death is replaced cold, not by a spare kept for each one
                  "hands": {"keep_dir": str(self.dir), "spare": False}}
        started = {"run": s.run, "task": s.task.id, "model": s.model, "epoch": s.epoch, "try": s.try_n,
                   "digest": s.task.digest(),
                   "verifier": s.task.verifier.kind, "limits": {"turns": s.task.limits.turns, "tokens": s.task.limits.tokens,
                                                                "seconds": s.task.limits.seconds}}
        # in the session's creating transaction: a run killed in between cannot leave an attempt without it
        # (the results and the eval_results view find attempts by their eval_started)
        title = f"eval {s.task.id} · {s.model} · epoch {s.epoch}" + (f" · try {s.try_n}" if s.try_n > 1 else "")
        brain.create_session(s.id, title=title, model=s.model,
                             config=config, kind="eval", then=[("eval_started", started)])

    async def _place_files(self) -> None:
        """Put the task's files in the attempt's workspace (again, whole, if a crash came before its first turn).
        NoWorkspace when there are files and the kernels run on a gateway, whose files are not on this machine."""
        if not self.spec.task.files:
            return  # nothing to put: a gateway's hands, which have no workspace here, serve such a task too
        hands = await self.host.brain.hands(self.spec.id)
        root = await hands.workspace(create=True)
        owner = hands.workspace_owner()
        for name, data in self.spec.task.files.items():
            await asyncio.to_thread(write_file, root, name, io.BytesIO(data), owner)

    async def run(self) -> dict[str, Any]:
        """Run (or go on with) the attempt; the payload of its `eval_finished`."""
        s, brain, log = self.spec, self.host.brain, self.host.log
        if not await asyncio.to_thread(log.has_session, s.id):
            await asyncio.to_thread(self._create)
        t0 = time.monotonic()
        try:
            while True:
                events = await brain.events(s.id)
                done = next((e for e in events if e.type == "eval_finished"), None)
                if done is not None:
                    return dict(done.payload)
                if turn_state(events).open:
                    await self._close_cut_off()
                    continue
                turns = sum(1 for e in events if e.type == "user_message")
                verdicts = [e for e in events if e.type == "eval_verdict"]
                if turns == 0:
                    try:
                        await self._place_files()
                    except NoWorkspace as e:
                        return await self._finish(events, {}, "error", f"error: the task's files cannot be put in: {e}")
                    await self.within(brain.run_turn(s.id, s.task.prompt, interrupted_by="eval"), t0)
                    continue
                if len(verdicts) < turns:
                    why = cut_off(events)
                    if why is not None:  # graded, it would measure the cut, not the model: an error, never graded
                        return await self._finish(events, {}, "error", f"error: {why}")
                    verdict = {"turn": turns, **(await self.verify(final_answer(events))).to_json()}
                    ended = self._stop(events, verdict, turns, t0)
                    if ended:  # the verdict ends the attempt: it and eval_finished in one transaction
                        return await self._finish(events, verdict, *ended, verdict=True)
                    await self._append("eval_verdict", verdict)
                    continue
                last = verdicts[-1].payload
                ended = self._stop(events, last, turns, t0)
                if ended:
                    return await self._finish(events, last, *ended)
                await self.within(brain.run_turn(s.id, FEEDBACK.format(explanation=last["explanation"]), interrupted_by="eval"), t0)
        except TimeoutError:
            events = await brain.events(s.id)
            verdicts = [e.payload for e in events if e.type == "eval_verdict"]
            last = verdicts[-1] if verdicts else {"passed": False, "score": 0.0, "explanation": "no verdict: out of time"}
            return await self._finish(events, last, "fail", "time")
        finally:
            if brain.running(s.id):  # cancelled or out of time: the turn records its interrupt before we go
                await brain.interrupt(s.id, by="eval")
            await brain.close_session(s.id)  # stop the attempt's kernel; its log and workspace stay

    async def within(self, coro: Any, t0: float) -> Any:
        """A turn within the attempt's time limit (cancelling it interrupts the turn, recorded as such)."""
        limit = self.spec.task.limits.seconds
        if not limit:
            return await coro
        left = limit - (time.monotonic() - t0)
        if left <= 0:
            coro.close()
            raise TimeoutError
        return await asyncio.wait_for(coro, left)

    async def _close_cut_off(self) -> None:
        """Close a turn that a process which died left open: its cut-off call is answered as interrupted (never
        re-run) and the turn ends, not gone on with (no model call): the attempt is an error whatever it does next."""
        await self.host.brain.resume(self.spec.id, close_by="eval")

    def _stop(self, events: list[Any], last: dict[str, Any], turns: int, t0: float) -> tuple[str, str] | None:
        """(outcome, reason) when the attempt ends now, or None to send the verdict back for another turn."""
        lim = self.spec.task.limits
        why = verdict_error(last)
        if why is not None:
            return "error", f"error: {why}"
        if last.get("passed"):
            return "pass", "passed"
        ended = [e.payload.get("stop_reason") for e in events if e.type == "turn_ended"]
        if ended and ended[-1] != "end_turn":
            return "fail", f"stopped: {ended[-1]}"
        if turns >= lim.turns:
            return "fail", "turns"
        if lim.tokens and sum(usage_of(events)) >= lim.tokens:
            return "fail", "tokens"
        if lim.seconds and time.monotonic() - t0 >= lim.seconds:
            return "fail", "time"
        return None

    async def _finish(self, events: list[Any], last: dict[str, Any], outcome: str, reason: str,
                      verdict: bool = False) -> dict[str, Any]:
        """Append `eval_finished` (after `last` as its `eval_verdict`, with `verdict`): an error has no grade (passed
        and score null), as the verdict never came."""
        ins, outs = usage_of(events)
        graded = outcome != "error"
        payload = {"outcome": outcome, "passed": bool(last.get("passed")) if graded else None,
                   "score": float(last.get("score") or 0.0) if graded else None, "reason": reason,
                   "cost": round(float(self.price(self.spec.model, ins, outs)), 6)}
        if verdict:
            await self._append("eval_verdict", last, ("eval_finished", payload))
        else:
            await self._append("eval_finished", payload)
        return payload

    async def verify(self, answer: str) -> Verdict:
        """The task's verifier over the workspace as the turn left it."""
        task, host = self.spec.task, self.host
        if task.verifier.kind == "rubric":
            name = task.verifier.model or self.grader_model or self.spec.model
            return await rubric_verdict(host.brain.model(name), task, answer, self.workspace)
        hands = await host.brain.hands(self.spec.id)
        with contextlib.suppress(NoWorkspace):  # a gateway's: the verdict says it could not check
            # the kept workspace, found again by a host that did not run the turn (the one that did was killed)
            await hands.workspace(create=True)
        return await python_verdict(host.hands, hands, task.verifier.code, answer, label=f"{self.spec.id}-check",
                                    timeout=task.verifier.timeout)
