"""The core commands: run, resume, sessions, show, export, demo."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..brain.tools import tool_named
from ..config import from_env
from ..errors import ConfigError, UnknownSession
from ..hands.factory import HandsSettings
from ..host import Host
from ..plugins import Command, CommandContext
from ..render import assistant_meta, event_text, table
from .console import EXIT_INTERRUPTED, EXIT_OK, EXIT_STOPPED, Console

STOP_REASONS = MappingProxyType({
    "end_turn": "the turn ended",
    "max_tokens": "stopped: the model hit max_tokens before finishing",
    "refusal": "stopped: the model refused to continue (refusal)",
    "pause_turn": "stopped: the model paused too many times in a row (pause_turn)",
    "interrupted": "interrupted",
    "error": "stopped: the model call or the harness failed (see `workbench show`)",
})


def _turn(args: argparse.Namespace, ctx: CommandContext, action: str) -> int:
    """Run (or resume) one turn with live output; the exit code says how it ended."""
    host = ctx.build_host(args)  # nothing runs yet: bad input exits before a kernel starts
    sid: str | None = args.session

    async def go() -> str | None:
        nonlocal sid
        try:
            log, brain = host.log, host.brain
            exists = bool(sid) and log.has_session(sid)
            if action == "resume" and not exists:
                raise UnknownSession(f"no session {sid!r}")
            if exists:
                model = log.session(sid)["model"]
                if getattr(args, "model", None) and args.model != model:
                    raise ConfigError(f"session {sid} uses model {model!r}; a session's model cannot change")
                if getattr(args, "tool", None):
                    raise ConfigError(f"session {sid} exists; its tools were fixed when it was created")
            else:
                model = args.model or host.models.default_name()
            host.models.check(model)
            for name in getattr(args, "tool", None) or ():
                tool_named(host.tools, name)  # an unknown tool fails before anything is written
            if action == "run" and not args.prompt.strip():
                raise ConfigError("the prompt is empty")
            await host.start()
            if action == "run" and not exists:
                tools = ["python", *dict.fromkeys(t for t in args.tool or () if t != "python")]
                sid = brain.create_session(sid, title=args.prompt.strip()[:60], model=model, tools=tools)["id"]
                print(f"session {sid} (model {model})", file=sys.stderr)
            assert sid is not None, "resume needs an existing session; run made one if there was none"
            stop = ctx.follow(host, sid, thinking=getattr(args, "thinking", False))
            try:
                return await (brain.run_turn(sid, args.prompt) if action == "run" else brain.resume(sid))
            finally:
                stop()
        finally:
            await host.close()

    try:
        stop = ctx.run(go)
    except KeyboardInterrupt:
        print(f"\nworkbench: interrupted; the turn was recorded as interrupted (session {sid})", file=sys.stderr)
        return EXIT_INTERRUPTED
    if stop is None:
        print(f"nothing to resume: the last turn of session {sid} has ended", file=sys.stderr)
        return EXIT_OK
    if stop == "end_turn":
        return EXIT_OK
    print(f"workbench: {STOP_REASONS.get(stop, 'stopped: ' + stop)} (session {sid})", file=sys.stderr)
    return EXIT_STOPPED


def cmd_run(args: argparse.Namespace, ctx: CommandContext) -> int:
    return _turn(args, ctx, "run")


def cmd_resume(args: argparse.Namespace, ctx: CommandContext) -> int:
    args.session = args.id
    return _turn(args, ctx, "resume")


def _read_only(args: argparse.Namespace, ctx: CommandContext) -> Host:
    return ctx.build_host(args, read_only=True, hands=False)


def _close(host: Host, ctx: CommandContext) -> None:
    ctx.run(host.close)


def cmd_sessions(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = _read_only(args, ctx)
    try:
        rows = host.log.sessions()
    finally:
        _close(host, ctx)
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
        return EXIT_OK
    if not rows:
        print("no sessions yet: start one with `workbench run \"...\"`", file=sys.stderr)
        return EXIT_OK
    print(table([(r["id"], r["created_at"][:19], r["model"], r["events"], r["state"], r["title"]) for r in rows],
                ("id", "created (UTC)", "model", "events", "state", "title"), (14, 19, 20, 6, 10)))
    return EXIT_OK


def cmd_show(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = _read_only(args, ctx)
    try:
        host.log.session(args.id)
        events = host.log.events(args.id)
    finally:
        _close(host, ctx)
    for e in events:
        head = f"{e.seq:>5} {e.ts.strftime('%H:%M:%S')} {e.type:<16}"
        if e.type == "assistant_turn":
            print(f"{head} {assistant_meta(e.payload)}")
            body = event_text(e, thinking=True)
            if body:
                print("        " + body.replace("\n", "\n        "))
        elif e.type in ("user_message", "tool_result"):
            print(f"{head} " + event_text(e)[:2000].replace("\n", "\n        "))
        else:
            print(f"{head} {event_text(e)[:300]}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = _read_only(args, ctx)
    try:
        host.log.session(args.id)
        for e in host.log.events(args.id):
            print(json.dumps({"seq": e.seq, "ts": e.ts.isoformat(), "type": e.type, "payload": e.payload}, ensure_ascii=False))
    finally:
        _close(host, ctx)
    return EXIT_OK


DEMO_PROMPT = "Make a small dataset of daily temperatures, summarise it, and tell me which week was warmest."


def demo_hands() -> HandsSettings:
    """The usual hands settings; without a working sandbox, plain local hands, said out loud.

    Only the demo may fall back: its code is fixed and ships with the package, while a
    session with a model refuses to run code until the sandbox works.
    """
    from ..hands.preflight import preflight
    from ..hands.sandbox import SandboxSettings

    settings = from_env(HandsSettings, prefix="WORKBENCH_HANDS_", pool_size=0)
    if settings.backend == "sandbox" and not settings.unsafe_unsandboxed:
        check = preflight(from_env(SandboxSettings))
        if not check.ok:
            print(
                f"[note: no sandbox on this machine ({check.reason}). The demo's code is fixed and ships with "
                "the package, so it runs in a plain local kernel; sessions with a model refuse to run code "
                f"until the sandbox works: {check.fix.split('; or,')[0]}]\n"
            )
            settings = dataclasses.replace(settings, backend="local")
    return settings


def cmd_demo(args: argparse.Namespace, ctx: CommandContext) -> int:
    # more than a plugin's command gets: its own hands settings, and hands lines printed beside the turn
    assert isinstance(ctx, Console), "the demo runs only from the workbench command, whose context is its Console"
    if args.db is None:
        args.db = str(Path(tempfile.mkdtemp(prefix="workbench-demo-")) / "demo.duckdb")
    print("workbench demo: an agent whose brain (here the offline scripted model) runs in this process,")
    print("whose hands are a separate Jupyter kernel, and whose memory is a DuckDB session log.\n")
    print(f"» user: {DEMO_PROMPT}\n")

    def show_hands(ev: Any) -> None:
        if ev.type == "hands_started":
            p = ev.payload
            print(f"[hands: {p.get('launcher', 'local')} kernel, generation {p['generation']}, ready in {p['start_ms']:.0f} ms]")

    async def go() -> tuple[str, str, int]:
        async with Host.open(args.db, hands=demo_hands(), plugins=ctx.plugins) as host:
            sid = host.brain.create_session(title="demo: temperature analysis", model="scripted:demo")["id"]
            stop_printing = ctx.follow(host, sid, side=sys.stdout, extra=show_hands)
            try:
                stop = await host.brain.run_turn(sid, DEMO_PROMPT)
            finally:
                stop_printing()
            return sid, stop, len(host.log.events(sid))

    sid, stop, n = ctx.run(go)
    print(f"\n\nThe turn ended ({stop}) after {n} events, all in {args.db}.")
    print(f"See them with:  workbench show {sid} --db {args.db}")
    print(f"or as JSON:     workbench export {sid} --db {args.db}")
    return EXIT_OK if stop == "end_turn" else EXIT_STOPPED


def _configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="what to tell the agent")
    p.add_argument("--session", help="session id: created if new, continued if it exists")
    p.add_argument("--model", help="scripted[:SCRIPT], claude-..., or anthropic:NAME (default: claude-opus-5-5 with a key, else scripted)")
    p.add_argument("--thinking", action="store_true", help="also print thinking text (to stderr) as it streams")
    p.add_argument("--tool", action="append", metavar="NAME",
                   help="a tool a new session may use besides python (repeat it; plugins add tools)")


def _session_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")


def _sessions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line")


CORE_COMMANDS = (
    Command("run", "run one user turn to completion", _configure_run, cmd_run),
    Command("resume", "finish a turn that was cut off", _session_id, cmd_resume),
    Command("sessions", "list sessions", _sessions_args, cmd_sessions),
    Command("show", "show a session's events, readable", _session_id, cmd_show),
    Command("export", "a session's events as JSON lines", _session_id, cmd_export),
    Command("demo", "offline demo: a short data analysis in a real kernel", lambda p: None, cmd_demo),
)
