"""Running a `delegate` call: start (or re-attach to) its children, hold them to their limits, read their answers.

Each child is an ordinary session (kind `delegate`) with its own hands, whose `session_created`
names its parent (`parent_id`) and the call that started it (`origin`). Its id is derived from the
parent, the call and its index, so a call resumed after a crash finds the children it started
instead of starting them again. Everything the parent learns about a child it reads from the
child's log: a child's crash (its kernel, its model, the harness) is data, never an exception here.
A child with a check keeps its workspace next to the log file (`<db>.delegate/CHILD`, as eval attempts
keep theirs) until its check has run, so that a host killed before then leaves it for the next one's check;
then it is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..plugins import PluginHost
from ..plugins.errors import TurnBusy, WorkbenchError
from ..plugins.hands import NoWorkspace, discard_kept_workspace, listing, python_verdict, write_file
from ..plugins.log import Event
from ..plugins.models import rubric_verdict, turn_state
from ..plugins.tools import ToolOutput
from .spec import ChildSpec

CHILD_SYSTEM = (
    "You are a delegated agent: another agent gave you the task in the next message. Work on it with your "
    "tools, then end with a final answer that stands on its own: it is all the other agent will read."
)


def child_id(parent_id: str, tool_use_id: str, index: int) -> str:
    """The id of a call's index-th child: the same every time the call is run or resumed."""
    return "d" + hashlib.sha256(f"{parent_id}\0{tool_use_id}\0{index}".encode()).hexdigest()[:15]


@dataclass
class Watch:
    """A running child's use of its limits, fed with its committed events (in any order, any number of times)."""

    spec: ChildSpec
    seen: dict[int, tuple[str, int, Any]] = field(default_factory=dict)  # seq -> (type, tokens, stop reason)
    reason: str | None = None
    over: asyncio.Event = field(default_factory=asyncio.Event)

    def feed(self, e: Event) -> None:
        if e.seq in self.seen or e.type not in ("user_message", "assistant_turn"):
            return
        message = e.payload.get("message") or {}
        self.seen[e.seq] = (e.type, _tokens(e.payload.get("usage")), message.get("stop_reason"))
        turns = tokens = 0
        going_on = False
        for seq in sorted(self.seen):  # the latest turn's responses: what a resumed child has used counts too
            type_, used, stop = self.seen[seq]
            if type_ == "user_message":
                turns = tokens = 0
            else:
                turns, tokens, going_on = turns + 1, tokens + used, stop in ("tool_use", "pause_turn")
        if going_on and turns >= self.spec.max_turns:
            self.stop(f"max_turns {self.spec.max_turns} reached")
        elif going_on and tokens >= self.spec.max_tokens:
            self.stop(f"max_tokens {self.spec.max_tokens} reached ({tokens} used)")

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.over.set()


def _tokens(usage: Any) -> int:
    if not isinstance(usage, dict):
        return 0
    keys = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return sum(v for k in keys if isinstance(v := usage.get(k), int) and not isinstance(v, bool))


class Delegation:
    """One delegate call: its parent, its children, and the host's brain they run in."""

    def __init__(self, host: PluginHost, parent_id: str, tool_use_id: str, specs: list[ChildSpec], depth: int,
                 files: dict[str, bytes], max_answer: int, max_copy: int = 16 * 1024 * 1024):
        self.host, self.brain = host, host.brain
        self.parent_id, self.tool_use_id = parent_id, tool_use_id
        self.specs, self.depth, self.files = specs, depth, files
        self.max_answer = max_answer
        self.max_copy = max_copy  # bytes of a child's workspace copied for its check
        self.ids = [child_id(parent_id, tool_use_id, i) for i in range(len(specs))]
        self.watches = {cid: Watch(spec) for cid, spec in zip(self.ids, specs, strict=True)}

    async def run(self) -> ToolOutput:
        """Start or re-attach to every child, wait for all of them (in parallel), and report each once."""
        loop = asyncio.get_running_loop()
        mine = set(self.ids)

        def on_commit(e: Event) -> None:  # the log's writer thread: hand the event to our loop
            if e.session_id in mine and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.watches[e.session_id].feed, e)

        unsubscribe = self.host.log.subscribe(on_commit)
        tasks = [asyncio.ensure_future(self._child(i)) for i in range(len(self.specs))]
        try:
            outcomes = await asyncio.gather(*tasks)
        except BaseException:
            # the parent's turn was interrupted (or its host is closing, or the harness failed): so are the children
            for t in tasks:
                t.cancel()
            await asyncio.shield(self._interrupt_all(f"parent {self.parent_id} interrupted"))
            raise
        finally:
            unsubscribe()
        return self._output(outcomes)

    async def _interrupt_all(self, why: str) -> None:
        for cid in self.ids:
            with contextlib.suppress(WorkbenchError):
                await self.brain.interrupt(cid, by=why)

    async def _child(self, i: int) -> dict[str, Any]:
        cid, spec = self.ids[i], self.specs[i]
        try:
            task = await self._start(i)
        except (WorkbenchError, PlacingFailed) as e:  # e.g. its model cannot be made: an observation, not the parent's failure
            outcome = {**await self._outcome(cid, spec), "status": "failed", "error": f"did not start: {e}"}
        else:
            outcome = await self._rounds(cid, spec, task)
        if not self.brain.running(cid):  # done with: its kernel (and workspace) are freed now, not at the host's close
            await self.brain.close_session(cid)
            if spec.check is not None and (kept := self._kept(cid)) is not None:  # checked, or never will be
                await asyncio.to_thread(discard_kept_workspace, kept)
        return outcome

    def _kept(self, cid: str) -> Path | None:
        """Where a child with a check keeps its workspace until the check has run (None: a log without a file)."""
        sql = self.host.log.sql()  # a log with a file offers SQL, and names its file
        return sql.path.with_name(sql.path.name + ".delegate") / cid if sql is not None else None

    async def _rounds(self, cid: str, spec: ChildSpec, task: asyncio.Task | None) -> dict[str, Any]:
        """Wait for the child's turn and check it; in outcome mode (`rounds` > 1) a failed verdict is the child's
        next message, until its check passes or its rounds are spent. Where it is (which turn, checked or not,
        the verdict sent or not) is read from its log each round, so a call resumed after a crash goes on from there."""
        while True:
            if task is not None:
                await self._wait(cid, task)
            outcome = await self._outcome(cid, spec)
            if spec.check is None:
                return outcome
            verdict = outcome["check"] = await self._check(cid, spec, outcome["answer"])
            outcome["rounds"] = rounds = sum(1 for e in await self.brain.events(cid) if e.type == "user_message")
            if (verdict["passed"] or rounds >= spec.rounds or outcome["status"] != "done"
                    or verdict.get("error") or verdict["explanation"].startswith("not checked:")):
                return outcome  # passed, out of rounds, cut off by a limit, or not graded: no second try would tell
            await self.brain.start_turn(cid, feedback(verdict, rounds, spec.rounds))
            task = self.brain.turn_task(cid)

    async def _check(self, cid: str, spec: ChildSpec, answer: str) -> dict[str, Any]:
        """The verdict on the child's latest turn: its Python check run in fresh hands of its own against a copy of
        the child's workspace taken while the child's processes are stopped (`python_verdict`, as an eval verifier
        is), or its rubric graded by a model on the answer and the workspace's files (`rubric_verdict`).

        The child never sees the check and cannot reach its kernel; the verdict is recorded in the
        child's log (`delegate_checked`), so a call resumed after a crash reads it instead of checking again."""
        check = spec.check
        assert check is not None, "a child with a check"
        events = await self.brain.events(cid)
        last_user = max((k for k, e in enumerate(events) if e.type == "user_message"), default=0)
        done = [e.payload for e in events[last_user:] if e.type == "delegate_checked"]
        if done:
            return done[-1]
        try:
            if check.code is not None:
                hands = await self.brain.hands(cid)
                if self._kept(cid) is not None:
                    with contextlib.suppress(NoWorkspace):  # a gateway's: the verdict says it could not check
                        await hands.workspace(create=True)  # the kept one, found again by a host that did not run it
                v = await python_verdict(self.host.hands, hands, check.code, answer, label=f"{cid}-check",
                                         limit_bytes=self.max_copy)
            else:  # a model grades the answer and the names of the files: no hands needed (a host without any grades)
                files = await asyncio.to_thread(listing, await self._workspace_of(cid))
                v = await rubric_verdict(self.brain.model(check.model or spec.model), rubric=check.rubric or "",
                                         task=spec.prompt, answer=answer, files=files)
            verdict = {"passed": v.passed, "score": v.score, "explanation": v.explanation, "kind": v.kind, **v.details}
        except WorkbenchError as e:  # e.g. the host is closing its hands factory: the check did not run
            verdict = {"passed": False, "score": 0.0, "explanation": f"not checked: {e}", "kind": check.kind,
                       "duration_ms": 0.0, "copy_notes": []}
        await self.host.log.aappend(cid, "delegate_checked", verdict)
        return verdict

    async def _workspace_of(self, cid: str) -> Path | None:
        """The child's workspace on this machine, kept or live; None where it has none (no code ran, no hands here,
        a gateway's)."""
        kept = self._kept(cid)
        if kept is not None and kept.is_dir():
            return kept
        with contextlib.suppress(WorkbenchError, NoWorkspace):
            return await (await self.brain.hands(cid)).workspace()
        return None

    async def _start(self, i: int) -> asyncio.Task | None:
        """Create the child if it is not there, place its files, start (or resume) its turn; its task, if one runs."""
        cid, spec = self.ids[i], self.specs[i]
        brain = self.brain
        if not await self.host.log.ahas_session(cid):
            origin = {"tool_use_id": self.tool_use_id, "index": i, "depth": self.depth + 1, "prompt": spec.prompt,
                      "limits": spec.limits(), "files": list(spec.files)}
            kept = self._kept(cid) if spec.check is not None else None
            config = {"hands": {"keep_dir": str(kept)}} if kept is not None else None
            await asyncio.to_thread(lambda: brain.create_session(
                cid, title=spec.title, model=spec.model, system=CHILD_SYSTEM, tools=list(spec.tools), config=config,
                kind="delegate", parent_id=self.parent_id, origin=origin))
        events = await brain.events(cid)
        for e in events:
            self.watches[cid].feed(e)
        if not any(e.type == "user_message" for e in events):
            if spec.files:
                await self._place_files(cid, spec)
            await brain.start_turn(cid, spec.prompt)
        elif turn_state(events).open and not brain.running(cid):
            with contextlib.suppress(TurnBusy):  # another resume (the server waking cut-off turns) got there first
                await brain.start_resume(cid)
        return brain.turn_task(cid)

    async def _place_files(self, cid: str, spec: ChildSpec) -> None:
        gone = [p for p in spec.files if p not in self.files]
        if gone:
            raise PlacingFailed(f"its files are gone from the parent's workspace ({', '.join(gone)[:200]})")
        hands = await self.brain.hands(cid)
        root = await hands.workspace(create=True)  # NoWorkspace where its hands run no code here
        assert root is not None, "workspace(create=True) makes one or raises"
        for p in spec.files:
            await asyncio.to_thread(write_file, root, p, io.BytesIO(self.files[p]), hands.workspace_owner())

    async def _wait(self, cid: str, task: asyncio.Task) -> None:
        """Wait for the child's turn; interrupt it when it passes a limit."""
        watch = self.watches[cid]
        started = next((e.ts.timestamp() for e in reversed(await self.brain.events(cid)) if e.type == "user_message"), time.time())
        deadline = started + watch.spec.timeout
        over = asyncio.ensure_future(watch.over.wait())
        try:
            while not task.done() and watch.reason is None:
                left = deadline - time.time()
                if left <= 0:
                    watch.stop(f"timeout {watch.spec.timeout:g} s reached")
                    break
                await asyncio.wait({task, over}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            over.cancel()
        if not task.done():
            with contextlib.suppress(WorkbenchError):
                await self.brain.interrupt(cid, by=f"delegate limit: {watch.reason}")
            await asyncio.wait({task})

    async def _outcome(self, cid: str, spec: ChildSpec) -> dict[str, Any]:
        """What the child's log says about its (latest) turn."""
        events = await self.brain.events(cid) if await self.host.log.ahas_session(cid) else []
        last_user = max((k for k, e in enumerate(events) if e.type == "user_message"), default=None)
        turn = events[last_user:] if last_user is not None else []
        out: dict[str, Any] = {"session_id": cid, "title": spec.title, "model": spec.model, "status": "not started",
                               "stop_reason": None, "answer": "", "turns": 0, "tokens": 0, "kernel_deaths": 0,
                               "started_at": turn[0].ts.isoformat() if turn else None, "ended_at": None}
        errors: list[str] = []
        for e in turn:
            p = e.payload
            if e.type == "assistant_turn":
                out["turns"] += 1
                out["tokens"] += _tokens(p.get("usage"))
                text = "".join(b.get("text", "") for b in (p.get("message") or {}).get("content", []) if b.get("type") == "text")
                if text.strip():
                    out["answer"] = text
            elif e.type == "hands_died":
                out["kernel_deaths"] += 1
            elif e.type == "interrupted":
                errors.append(f"interrupted ({p.get('by')})")
            elif e.type in ("model_error", "turn_failed"):
                errors.append(f"{e.type.replace('_', ' ')}: {str(p.get('error'))[:300]}")
            elif e.type == "turn_ended":
                out["stop_reason"], out["ended_at"] = p.get("stop_reason"), e.ts.isoformat()
        stop = out["stop_reason"]
        if turn:
            out["status"] = ("done" if stop == "end_turn" else "interrupted" if stop == "interrupted"
                             else "failed" if stop == "error" else "unfinished" if stop is None else str(stop))
        if errors:
            out["error"] = "; ".join(errors)
        return out

    def _output(self, outcomes: list[dict[str, Any]]) -> ToolOutput:
        blocks = []
        n = len(outcomes)
        for i, o in enumerate(outcomes):
            head = (f"child {i + 1} of {n} (session {o['session_id']}, {o['model']}): {o['status']}"
                    f" after {o['turns']} model response(s), {o['tokens']} tokens")
            if "check" in o:
                c = o["check"]
                head += f"\ncheck: {'passed' if c['passed'] else 'FAILED'}: {c['explanation'][-500:]}"
                if o.get("rounds", 1) > 1:
                    head += f" (after {o['rounds']} turns)"
            if o["kernel_deaths"]:
                head += f"; its kernel died {o['kernel_deaths']} time(s)"
            if o.get("error"):
                head += f"\n{o['error']}"
            answer = o["answer"]
            if len(answer) > self.max_answer:
                answer = answer[: self.max_answer] + f"\n[... {len(answer) - self.max_answer} more characters in session {o['session_id']}]"
            blocks.append({"type": "text", "text": head + ("\n\n" + answer if answer else "\n\n(no final answer)")})
        return ToolOutput(blocks, is_error=False, details={"children": outcomes})


def feedback(verdict: dict[str, Any], round_: int, rounds: int) -> str:
    """The message a child gets when its check failed and it has turns left (outcome mode)."""
    return (f"A check of your work failed (turn {round_} of {rounds}): {verdict['explanation'][-2000:]}\n\n"
            "Fix what it says, then give your final answer again.")


class PlacingFailed(Exception):
    """The child's files could not be written into its workspace (the message says why)."""


def depth_of(created: Event | None) -> int:
    """How deep a session is in a delegation tree (0 for a session nobody delegated to)."""
    origin = (created.payload.get("origin") if created is not None else None) or {}
    depth = origin.get("depth", 0) if isinstance(origin, dict) else 0
    return depth if isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0 else 0

