"""The core commands: run, resume, sessions, show, export, demo."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from ..brain.tools import tool_named
from ..config import from_env
from ..errors import ConfigError, UnknownSession
from ..hands.factory import HandsSettings
from ..host import Host
from ..log import DuckDBLog
from ..log.manage import auto_title
from ..plugins import Command, CommandContext
from ..render import table
from ..strictnum import argument
from ..usage import session_usage
from .console import EXIT_INTERRUPTED, EXIT_OK, EXIT_STOPPED, Console, Printer
from .remote import Remote
from .show import print_show

T = TypeVar("T")

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
                sid = brain.create_session(sid, title=auto_title(args.prompt), model=model, tools=tools,
                                           message=args.prompt)["id"]
                print(f"session {sid} (model {model})", file=sys.stderr)
            assert sid is not None, "resume needs an existing session; run made one if there was none"
            stop = ctx.follow(host, sid, thinking=getattr(args, "thinking", False))
            try:
                # a resume goes through the host: a plugin may resume its kind of session as a whole (a dream)
                return await (brain.run_turn(sid, args.prompt) if action == "run" else host.resume(sid))
            finally:
                stop()
        finally:
            await host.close()

    try:
        stop = ctx.run(go)
    except KeyboardInterrupt:
        print(f"\nworkbench: interrupted; the turn was recorded as interrupted (session {sid})", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _ended(stop, sid)


def _ended(stop: str | None, sid: str | None) -> int:
    """The exit code of a turn that stopped with `stop` (None: there was nothing to resume), saying so."""
    if stop is None:
        print(f"nothing to resume: the last turn of session {sid} has ended", file=sys.stderr)
        return EXIT_OK
    if stop == "end_turn":
        return EXIT_OK
    print(f"workbench: {STOP_REASONS.get(stop, 'stopped: ' + stop)} (session {sid})", file=sys.stderr)
    return EXIT_STOPPED


def _remote_turn(args: argparse.Namespace, r: Remote, action: str) -> int:
    """`run` / `resume` through the server: the turn runs there, its events and deltas come over the websocket."""
    sid: str | None = args.session
    row = r.session(sid) if sid else None
    if action == "resume" and row is None:
        raise UnknownSession(f"no session {sid!r}")
    if row is not None:
        model = row["model"]
        if getattr(args, "model", None) and args.model != model:
            raise ConfigError(f"session {sid} uses model {model!r}; a session's model cannot change")
        if getattr(args, "tool", None):
            raise ConfigError(f"session {sid} exists; its tools were fixed when it was created")
    if action == "run" and not args.prompt.strip():
        raise ConfigError("the prompt is empty")
    if action == "run" and row is None:
        tools = ["python", *dict.fromkeys(t for t in args.tool or () if t != "python")]
        with r.answers():
            row = r.client.create_session(id=sid, title=auto_title(args.prompt), model=args.model, tools=tools,
                                          first_message=args.prompt)
        sid = row["id"]
        print(f"session {sid} (model {row['model']})", file=sys.stderr)
    assert sid is not None and row is not None, "resume needs an existing session; run made one if there was none"
    printer = Printer(sid, thinking=getattr(args, "thinking", False))
    after = row["last_seq"]

    def start() -> int | None:
        if action == "run":
            return r.client.send(sid, args.prompt)
        return after if r.client.resume(sid) else None

    try:
        stop = r.follow(sid, after, start, printer.event, printer.delta, printer.output)
    except KeyboardInterrupt:
        r.interrupt(sid)
        print(f"\nworkbench: interrupted; the turn was recorded as interrupted (session {sid})", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _ended(stop, sid)


def remote_run(args: argparse.Namespace, r: Remote) -> int:
    return _remote_turn(args, r, "run")


def remote_resume(args: argparse.Namespace, r: Remote) -> int:
    args.session = args.id
    return _remote_turn(args, r, "resume")


def cmd_run(args: argparse.Namespace, ctx: CommandContext) -> int:
    return _turn(args, ctx, "run")


def cmd_resume(args: argparse.Namespace, ctx: CommandContext) -> int:
    args.session = args.id
    return _turn(args, ctx, "resume")


def _read_only(args: argparse.Namespace, ctx: CommandContext) -> Host:
    return ctx.build_host(args, read_only=True, hands=False)


def _close(host: Host, ctx: CommandContext) -> None:
    ctx.run(host.close)


def _listing(args: argparse.Namespace) -> dict[str, Any]:
    """The filters of `workbench sessions` as the log (and the API) take them."""
    given = {"kind": args.kind, "state": args.state, "text": args.search, "updated_after": args.updated_after,
             "updated_before": args.updated_before, "archived": None if args.all else bool(args.archived),
             "order": None if args.order is None and not args.reverse else ("-" if args.reverse else "") + (args.order or "created")}
    return {k: v for k, v in given.items() if v is not None}


def _print_sessions(args: argparse.Namespace, rows: list[dict[str, Any]], next_cursor: str | None) -> int:
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
    elif not rows:
        if args.cursor or set(_listing(args)) - {"archived"} or args.archived:
            print("no sessions match", file=sys.stderr)
        else:
            print("no sessions yet: start one with `workbench run \"...\"`", file=sys.stderr)
    elif args.usage:
        print(table([(r["id"], r["created_at"][:19], r["model"], r["events"], r["state"], _tokens(r["usage"]),
                      f"${r['usage']['total']['cost']:.4f}" if r["usage"]["priced"] else "-", r["title"]) for r in rows],
                    ("id", "created (UTC)", "model", "events", "state", "tokens in/out", "cost", "title"),
                    (14, 19, 20, 6, 10, 17, 9)))
    else:
        print(table([(r["id"], r["created_at"][:19], r["model"], r["events"], r["state"], r["title"]) for r in rows],
                    ("id", "created (UTC)", "model", "events", "state", "title"), (14, 19, 20, 6, 10)))
    if next_cursor is not None:
        print(f"more: the next page is `--cursor {next_cursor}` (with the same filters and --limit)", file=sys.stderr)
    return EXIT_OK


def _tokens(usage: dict[str, Any]) -> str:
    t = usage["total"]
    ins = t["input_tokens"] + t["cache_read_input_tokens"] + t["cache_creation_input_tokens"]
    return f"{ins:,}/{t['output_tokens']:,}"


def _check_listing(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as e:
        raise ConfigError(str(e)) from None


def cmd_sessions(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = _read_only(args, ctx)
    try:
        if args.limit is None and args.cursor is None:
            rows, cursor = _check_listing(lambda: host.log.sessions(**_listing(args))), None
        else:
            page = _check_listing(lambda: host.log.sessions_page(limit=args.limit or 50, cursor=args.cursor, **_listing(args)))
            rows, cursor = page["sessions"], page["next"]
        if args.usage:  # a read of each listed session's model calls: meant for a page, not a whole large log
            for r in rows:
                events = host.log.events(r["id"], types=["session_created", "user_message", "assistant_turn"])
                r["usage"] = {"session_id": r["id"], **session_usage(events, host.prices, r["model"])}
    finally:
        _close(host, ctx)
    return _print_sessions(args, rows, cursor)


def remote_sessions(args: argparse.Namespace, r: Remote) -> int:
    with r.answers():
        if args.limit is None and args.cursor is None:
            rows, cursor = r.client.sessions(**_listing(args)), None
        else:
            page = r.client.sessions_page(limit=args.limit or 50, cursor=args.cursor, **_listing(args))
            rows, cursor = page["sessions"], page["next"]
    for row in rows:
        row.pop("running", None)  # the log's row, as a local listing prints it
        if args.usage:
            with r.answers():
                row["usage"] = r.client.usage(row["id"])
    return _print_sessions(args, rows, cursor)


def _print_export(events: list[Any]) -> int:
    for e in events:
        print(json.dumps({"seq": e.seq, "ts": e.ts.isoformat(), "type": e.type, "payload": e.payload}, ensure_ascii=False))
    return EXIT_OK


def cmd_show(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = _read_only(args, ctx)
    try:
        row = host.log.session(args.id)
        events = host.log.events(args.id)
        usage = session_usage(events, host.prices, row["model"])
    finally:
        _close(host, ctx)
    return print_show(args, events, row, usage)


def cmd_export(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = _read_only(args, ctx)
    try:
        session = host.log.session(args.id)
        events = host.log.events(args.id)
    finally:
        _close(host, ctx)
    return _print_notebook(session, events) if args.ipynb else _print_export(events)


def _print_notebook(session: dict[str, Any], events: list[Any]) -> int:
    from ..export import session_notebook

    print(json.dumps(session_notebook(session, events), ensure_ascii=False, indent=1))
    return EXIT_OK


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("--ipynb", action="store_true",
                   help="the session's code and outputs as a notebook (nbformat 4) instead of its events")


def _remote_events(args: argparse.Namespace, r: Remote) -> list[Any]:
    if r.session(args.id) is None:
        raise UnknownSession(f"no session {args.id!r}")
    return r.events(args.id)


def remote_show(args: argparse.Namespace, r: Remote) -> int:
    events = _remote_events(args, r)
    with r.answers():
        usage = r.client.usage(args.id)
    return print_show(args, events, r.session(args.id), usage)


def remote_export(args: argparse.Namespace, r: Remote) -> int:
    if args.ipynb:  # built here from the events, as on the file: the same notebook either way
        session = r.session(args.id)
        if session is None:
            raise UnknownSession(f"no session {args.id!r}")
        return _print_notebook(session, r.events(args.id))
    return _print_export(_remote_events(args, r))


def cmd_close_hands(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Close a session's hands in the workbench server that runs them (its REST API)."""
    from ..client.api import connect

    client = connect(args.url, args.token)
    try:
        status = client.close_hands(args.id)
    finally:
        client.close()
    if args.json:
        print(json.dumps(status, ensure_ascii=False))
    elif status.get("closed"):
        print(f"closed the hands of session {args.id} (generation {status.get('generation')}); "
              "its workspace stays, and its next call starts a kernel again")
    else:
        print(f"session {args.id} had no kernel running; nothing to close")
    return EXIT_OK


def _close_hands_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("--url", help="the Jupyter server's URL (default: $WORKBENCH_URL, else the one running server)")
    p.add_argument("--token", help="its token (default: the found server's, or $WORKBENCH_TOKEN / $JUPYTER_TOKEN with --url)")
    p.add_argument("--json", action="store_true", help="print the hands' status as JSON")


DEMO_PROMPT = "Make a small dataset of daily temperatures, summarise it, and tell me which week was warmest."


def demo_hands() -> HandsSettings:
    """The usual hands settings; without a working sandbox, plain local hands, said out loud.

    Only the demo may fall back: its code is fixed and ships with the package, while a
    session with a model refuses to run code until the sandbox works.
    """
    from ..hands.isolating import SandboxSettings, preflight

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
    else:
        DuckDBLog(args.db).close()  # DatabaseLocked now, before anything is printed, if a server holds it
    _demo_intro()

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
    return _demo_end(args, sid, stop, n)


def _demo_intro() -> None:
    print("workbench demo: an agent whose brain (here the offline scripted model) runs in this process,")
    print("whose hands are a separate Jupyter kernel, and whose memory is a DuckDB session log.\n")
    print(f"» user: {DEMO_PROMPT}\n")


def show_hands(ev: Any) -> None:
    if ev.type == "hands_started":
        p = ev.payload
        print(f"[hands: {p.get('launcher', 'local')} kernel, generation {p['generation']}, ready in {p['start_ms']:.0f} ms]")


def _demo_end(args: argparse.Namespace, sid: str, stop: str | None, n: int) -> int:
    print(f"\n\nThe turn ended ({stop}) after {n} events, all in {args.db}.")
    print(f"See them with:  workbench show {sid} --db {args.db}")
    print(f"or as JSON:     workbench export {sid} --db {args.db}")
    return EXIT_OK if stop == "end_turn" else EXIT_STOPPED


def remote_demo(args: argparse.Namespace, r: Remote) -> int:
    """The demo in the server that holds --db: the same session, run there, printed here."""
    _demo_intro()
    with r.answers():
        sid = r.client.create_session(title="demo: temperature analysis", model="scripted:demo")["id"]
    printer = Printer(sid, side=sys.stdout)

    def on_event(ev: Any) -> None:
        show_hands(ev)
        printer.event(ev)

    try:
        stop = r.follow(sid, 0, lambda: r.client.send(sid, DEMO_PROMPT), on_event, printer.delta, printer.output)
    except KeyboardInterrupt:
        r.interrupt(sid)
        print(f"\nworkbench: interrupted; the turn was recorded as interrupted (session {sid})", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _demo_end(args, sid, stop, len(r.events(sid)))


def _configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="what to tell the agent")
    p.add_argument("--session", help="session id: created if new, continued if it exists")
    p.add_argument("--model", help="scripted[:SCRIPT], claude-..., or anthropic:NAME (default: claude-opus-5-5 with a key, else scripted)")
    p.add_argument("--thinking", action="store_true", help="also print thinking text (to stderr) as it streams")
    p.add_argument("--tool", action="append", metavar="NAME",
                   help="a tool a new session may use besides python (repeat it; plugins add tools)")


def _session_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")


def _show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("--events", action="store_true", help="every event on a line of its own, as the log has them")


def _sessions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--state", choices=("new", "unfinished", "ended"), help="only sessions in this state")
    p.add_argument("--kind", help="only sessions of this kind (chat, dream)")
    p.add_argument("--search", metavar="TEXT", help="only sessions whose title contains TEXT (any case; "
                   "`workbench search` also reads their messages)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--archived", action="store_true", help="only archived sessions (they are hidden otherwise)")
    shown.add_argument("--all", action="store_true", help="archived sessions as well as the others")
    p.add_argument("--updated-after", metavar="TIME", help="only sessions active after TIME (ISO 8601; UTC unless it says)")
    p.add_argument("--updated-before", metavar="TIME", help="only sessions last active before TIME (ISO 8601)")
    p.add_argument("--order", choices=("created", "updated"), help="by creation (the default) or by last activity, oldest first")
    p.add_argument("--reverse", action="store_true", help="newest (or most recently active) first")
    p.add_argument("--limit", type=argument(int), metavar="N",
                   help="one page of at most N sessions (1 to 1000); the next cursor goes to stderr")
    p.add_argument("--cursor", help="the page after the one that printed this cursor (same filters and order)")
    p.add_argument("--usage", action="store_true", help="also each session's tokens in/out and estimated cost "
                   "(reads each listed session's model calls: best with --limit)")


CORE_COMMANDS = (
    Command("run", "run one user turn to completion", _configure_run, cmd_run, remote=remote_run),
    Command("resume", "finish a turn that was cut off", _session_id, cmd_resume, remote=remote_resume),
    Command("sessions", "list sessions", _sessions_args, cmd_sessions, remote=remote_sessions),
    Command("show", "a session as a readable transcript", _show_args, cmd_show, remote=remote_show),
    Command("export", "a session's events as JSON lines, or with --ipynb its code and outputs as a notebook",
            _export_args, cmd_export, remote=remote_export),
    Command("demo", "offline demo: a short data analysis in a real kernel", lambda p: None, cmd_demo, remote=remote_demo),
    Command("close-hands", "stop a session's kernel in the running workbench server", _close_hands_args, cmd_close_hands,
            needs_db=False),
)
