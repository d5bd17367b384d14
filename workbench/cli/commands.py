"""The core commands: run, resume, sessions, show, export, demo."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..config import from_env
from ..errors import ConfigError, UnknownSession
from ..hands.factory import HandsSettings
from ..log import DuckDBLog
from ..log.manage import auto_title
from ..plugins import Command, CommandContext
from ..render import table
from ..strictnum import argument
from .console import EXIT_INTERRUPTED, EXIT_OK, EXIT_STOPPED, Console, Printer
from .service import Service, on_service, printed, row_or_none
from .show import print_show

if TYPE_CHECKING:
    from ..host import Host

STOP_REASONS = MappingProxyType({
    "end_turn": "the turn ended",
    "max_tokens": "stopped: the model hit max_tokens before finishing",
    "refusal": "stopped: the model refused to continue (refusal)",
    "pause_turn": "stopped: the model paused too many times in a row (pause_turn)",
    "interrupted": "interrupted",
    "error": "stopped: the model call or the harness failed (see `workbench show`)",
})


def _turn(args: argparse.Namespace, wb: Service, action: str) -> int:
    """Run (or resume) one turn with live output; the exit code says how it ended."""
    sid: str | None = args.session
    row = row_or_none(wb, sid)
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
        row = wb.run(lambda s: s.create_session(id=sid, title=auto_title(args.prompt), model=args.model, tools=tools,
                                                first_message=args.prompt))
        print(f"session {row['id']} (model {row['model']})", file=sys.stderr)
    assert row is not None, "resume needs an existing session; run made one if there was none"
    sid = str(row["id"])
    watch = printed(Printer(sid, thinking=getattr(args, "thinking", False)))
    try:
        stop = wb.run(lambda s: s.run_turn(sid, args.prompt, watch) if action == "run" else s.resume_turn(sid, watch))
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


def run_cmd(args: argparse.Namespace, wb: Service) -> int:
    return _turn(args, wb, "run")


def resume_cmd(args: argparse.Namespace, wb: Service) -> int:
    args.session = args.id
    return _turn(args, wb, "resume")


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


def sessions_cmd(args: argparse.Namespace, wb: Service) -> int:
    page = wb.run(lambda s: s.sessions(limit=args.limit, cursor=args.cursor, **_listing(args)))
    rows = page["sessions"]
    for row in rows:
        row.pop("running", None)  # the log's row
        if args.usage:  # a read of each listed session's model calls: meant for a page, not a whole large log
            row["usage"] = _usage(wb, row["id"])
    return _print_sessions(args, rows, page["next"])


def _usage(wb: Service, session_id: str) -> dict[str, Any]:
    return wb.run(lambda s: s.usage(session_id))


def _print_export(events: list[Any]) -> int:
    for e in events:
        print(json.dumps({"seq": e.seq, "ts": e.ts.isoformat(), "type": e.type, "payload": e.payload}, ensure_ascii=False))
    return EXIT_OK


def show_cmd(args: argparse.Namespace, wb: Service) -> int:
    row = wb.run(lambda s: s.session(args.id))
    row.pop("running", None)
    events = wb.run(lambda s: s.events(args.id))
    return print_show(args, events, row, wb.run(lambda s: s.usage(args.id)))


def export_cmd(args: argparse.Namespace, wb: Service) -> int:
    if args.ipynb:
        print(json.dumps(wb.run(lambda s: s.notebook(args.id)), ensure_ascii=False, indent=1))
        return EXIT_OK
    return _print_export(wb.run(lambda s: s.events(args.id)))


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("--ipynb", action="store_true",
                   help="the session's code and outputs as a notebook (nbformat 4) instead of its events")


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


def _one_turn_host(args: argparse.Namespace, ctx: CommandContext) -> Host:
    """The host of `run` and `resume`: its process ends with the turn, so its warm pool starts one kernel (beside
    the model's first request) and none in the place of the one taken: that one would be stopped unused, a whole
    sandboxed start (workspace, bwrap, kernel) for nothing. WORKBENCH_HANDS_POOL_REFILL=true refills anyway."""
    settings = from_env(HandsSettings, prefix="WORKBENCH_HANDS_", defaults={"pool_refill": False})
    assert isinstance(ctx, Console), "run and resume take their hands settings from the workbench command's Console"
    return ctx.build_host(args, hands=settings)


def _demo_host(args: argparse.Namespace, ctx: CommandContext) -> Host:
    """A host of its own for the demo (its own hands settings), on a new file unless --db names one."""
    if args.db is None:
        args.db = str(Path(tempfile.mkdtemp(prefix="workbench-demo-")) / "demo.duckdb")
    else:
        DuckDBLog(args.db).close()  # DatabaseLocked now, before anything is printed, if a server holds it
    # more than a plugin's command gets: hands settings of its own
    assert isinstance(ctx, Console), "the demo runs only from the workbench command, whose context is its Console"
    return ctx.build_host(args, hands=demo_hands())


def demo_cmd(args: argparse.Namespace, wb: Service) -> int:
    """The demo: one scripted session, hands lines printed beside the turn."""
    _demo_intro()
    sid = wb.run(lambda s: s.create_session(title="demo: temperature analysis", model="scripted:demo"))["id"]
    watch = printed(Printer(sid, side=sys.stdout), extra=show_hands)
    try:
        stop = wb.run(lambda s: s.run_turn(sid, DEMO_PROMPT, watch))
    except KeyboardInterrupt:
        print(f"\nworkbench: interrupted; the turn was recorded as interrupted (session {sid})", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _demo_end(args, sid, stop, len(wb.run(lambda s: s.events(sid))))


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
    Command("run", "run one user turn to completion", _configure_run, **on_service(run_cmd, build=_one_turn_host)),
    Command("resume", "finish a turn that was cut off", _session_id, **on_service(resume_cmd, build=_one_turn_host)),
    Command("sessions", "list sessions", _sessions_args, **on_service(sessions_cmd, read_only=True)),
    Command("show", "a session as a readable transcript", _show_args, **on_service(show_cmd, read_only=True)),
    Command("export", "a session's events as JSON lines, or with --ipynb its code and outputs as a notebook",
            _export_args, **on_service(export_cmd, read_only=True)),
    Command("demo", "offline demo: a short data analysis in a real kernel", lambda p: None,
            **on_service(demo_cmd, build=_demo_host)),
    Command("close-hands", "stop a session's kernel in the running workbench server", _close_hands_args, cmd_close_hands,
            needs_db=False),
)
