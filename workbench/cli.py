"""The `workbench` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError, UnknownSession, WorkbenchError

EXIT_OK, EXIT_STOPPED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

STOP_REASONS = {
    "end_turn": "the turn ended",
    "max_tokens": "stopped: the model hit max_tokens before finishing",
    "refusal": "stopped: the model refused to continue (refusal)",
    "pause_turn": "stopped: the model paused too many times in a row (pause_turn)",
    "interrupted": "interrupted",
    "error": "stopped: the model call failed (see `workbench show` for the error)",
}


class Printer:
    """Shows a turn as it happens: text deltas live, tool calls and results as committed."""

    def __init__(self, session_id: str, *, out=sys.stdout, side=sys.stderr, thinking: bool = False):
        self.session_id, self.out, self.side, self.thinking = session_id, out, side, thinking
        self._at_line_start = True

    def _write(self, stream, text: str) -> None:
        stream.write(text)
        stream.flush()

    def delta(self, session_id: str, ev: dict[str, Any]) -> None:
        if session_id != self.session_id or ev.get("type") != "content_block_delta":
            return
        d = ev["delta"]
        if d.get("type") == "text_delta":
            self._write(self.out, d["text"])
            self._at_line_start = d["text"].endswith("\n")
        elif d.get("type") == "thinking_delta" and self.thinking:
            self._write(self.side, d["thinking"])

    def event(self, ev: Any) -> None:
        if ev.session_id != self.session_id:
            return
        p = ev.payload
        if ev.type == "assistant_turn" and not self._at_line_start:
            self._write(self.out, "\n")
            self._at_line_start = True
        if ev.type == "tool_started" and p["name"] == "python":
            code = p["input"].get("code", "")
            self._write(self.side, "\n┌─ python ─────\n" + "".join(f"│ {line}\n" for line in code.splitlines()))
        elif ev.type == "tool_started":
            self._write(self.side, f"\n┌─ {p['name']} {json.dumps(p['input'])[:200]}\n")
        elif ev.type == "tool_result":
            text = "\n".join(b.get("text", "") for b in p["content"] if b.get("type") == "text")
            images = sum(1 for b in p["content"] if b.get("type") == "image")
            lines = text.splitlines()[:40] + ([f"[{images} image(s)]"] if images else [])
            mark = "✗" if p.get("is_error") else "└"
            self._write(self.side, "".join(f"│ {line}\n" for line in lines) + f"{mark}──────────────\n\n")
        elif ev.type in ("hands_died", "hands_timeout", "model_retry", "model_error", "hands_refused"):
            self._write(self.side, f"[{ev.type}] {json.dumps(p)[:300]}\n")


def _open_log(args: argparse.Namespace, read_only: bool = False):
    from .log import SessionLog

    return SessionLog(args.db, read_only=read_only)


def _run_async(coro_fn: Callable[[], Any]) -> Any:
    """Run a coroutine; SIGTERM interrupts it like Ctrl-C, so kernels are stopped."""

    async def main() -> Any:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await coro_fn()

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


def _turn(args: argparse.Namespace, action: str) -> int:
    from .brain import Brain
    from .brain.models import check_model_name, default_model_name

    log = _open_log(args)
    try:
        exists = log.has_session(args.session) if args.session else False
        if action == "resume" and not exists:
            raise UnknownSession(f"no session {args.session!r}")
        if exists:
            model = log.session(args.session)["model"]
            if getattr(args, "model", None) and args.model != model:
                raise ConfigError(f"session {args.session} uses model {model!r}; a session's model cannot change")
        else:
            model = args.model or default_model_name()
        check_model_name(model)
        if action == "run" and not args.prompt.strip():
            raise ConfigError("the prompt is empty")
        hands = _hands_factory()
        brain = Brain(log, hands_factory=hands, redact=getattr(hands, "redact", None))
        from .memory import attach

        attach(brain)  # new sessions start with the accepted memories
        if action == "run" and not exists:
            sid = brain.create_session(args.session, title=args.prompt.strip()[:60], model=model)["id"]
            print(f"session {sid} (model {model})", file=sys.stderr)
        else:
            sid = args.session
        printer = Printer(sid, thinking=getattr(args, "thinking", False))
        brain.listen(printer.delta)
        log.subscribe(printer.event)

        async def go() -> str | None:
            try:
                await hands.start()
                if action == "run":
                    return await brain.run_turn(sid, args.prompt)
                return await brain.resume(sid)
            finally:
                await brain.close()
                await hands.close()

        try:
            stop = _run_async(go)
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
    finally:
        log.close()


def _hands_factory():
    """The hands factory for one CLI command (WORKBENCH_HANDS_* settings), after reaping orphans."""
    from .config import from_env
    from .hands.factory import HandsFactory, HandsSettings
    from .hands.reaper import reap_orphans

    settings = from_env(HandsSettings, prefix="WORKBENCH_HANDS_")
    reap_orphans(settings.registry_dir or None)
    return HandsFactory(settings)


def cmd_run(args: argparse.Namespace) -> int:
    return _turn(args, "run")


def cmd_resume(args: argparse.Namespace) -> int:
    args.session = args.id
    return _turn(args, "resume")


def cmd_sessions(args: argparse.Namespace) -> int:
    with _open_log(args, read_only=True) as log:
        rows = log.sessions()
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return EXIT_OK
    if not rows:
        print("no sessions yet: start one with `workbench run \"...\"`", file=sys.stderr)
        return EXIT_OK
    print(f"{'id':<14} {'created (UTC)':<20} {'model':<20} {'events':>6}  {'state':<12} title")
    for r in rows:
        print(f"{r['id']:<14} {r['created_at'][:19]:<20} {r['model'][:20]:<20} {r['events']:>6}  {r['state']:<12} {r['title'] or ''}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with _open_log(args, read_only=True) as log:
        log.session(args.id)
        events = log.events(args.id)
    for e in events:
        p = e.payload
        head = f"{e.seq:>5} {e.ts.strftime('%H:%M:%S')} {e.type:<16}"
        if e.type == "user_message":
            print(f"{head} {p['text']}")
        elif e.type == "assistant_turn":
            m = p["message"]
            print(f"{head} stop={m.get('stop_reason')} latency={p.get('latency_ms')}ms usage={json.dumps(m.get('usage'))}")
            for b in m["content"]:
                if b["type"] == "text":
                    print("        " + b["text"].replace("\n", "\n        "))
                elif b["type"] == "thinking":
                    print(f"        (thinking, {len(b['thinking'])} chars, signed)")
                elif b["type"] == "redacted_thinking":
                    print("        (redacted thinking)")
                elif b["type"] == "tool_use":
                    print(f"        → {b['name']} {json.dumps(b['input'])[:500]}")
        elif e.type == "tool_result":
            text = "\n".join(b.get("text", "") for b in p["content"] if b.get("type") == "text")
            print(f"{head} {'ERROR ' if p.get('is_error') else ''}" + text[:2000].replace("\n", "\n        "))
        else:
            print(f"{head} {json.dumps(p, ensure_ascii=False)[:300]}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    with _open_log(args, read_only=True) as log:
        log.session(args.id)
        for e in log.events(args.id):
            print(json.dumps({"seq": e.seq, "ts": e.ts.isoformat(), "type": e.type, "payload": e.payload}, ensure_ascii=False))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .brain import Brain

    if args.db is None:
        args.db = str(Path(tempfile.mkdtemp(prefix="workbench-demo-")) / "demo.duckdb")
    prompt = "Make a small dataset of daily temperatures, summarise it, and tell me which week was warmest."
    print("workbench demo: an agent whose brain (here the offline scripted model) runs in this process,")
    print("whose hands are a separate Jupyter kernel, and whose memory is a DuckDB session log.\n")
    print(f"» user: {prompt}\n")
    hands = _demo_hands_factory()
    with _open_log(args) as log:
        brain = Brain(log, hands_factory=hands, redact=getattr(hands, "redact", None))
        sid = brain.create_session(title="demo: temperature analysis", model="scripted:demo")["id"]
        printer = Printer(sid, side=sys.stdout, thinking=False)
        brain.listen(printer.delta)

        def show(ev: Any) -> None:
            if ev.session_id == sid and ev.type == "hands_started":
                p = ev.payload
                print(f"[hands: {p.get('launcher', 'local')} kernel, generation {p['generation']}, ready in {p['start_ms']:.0f} ms]")
            printer.event(ev)

        log.subscribe(show)

        async def go() -> str:
            try:
                await hands.start()
                return await brain.run_turn(sid, prompt)
            finally:
                await brain.close()
                await hands.close()

        stop = _run_async(go)
        n = len(log.events(sid))
    print(f"\n\nThe turn ended ({stop}) after {n} events, all in {args.db}.")
    print(f"See them with:  workbench show {sid} --db {args.db}")
    print(f"or as JSON:     workbench export {sid} --db {args.db}")
    return EXIT_OK if stop == "end_turn" else EXIT_STOPPED


def _demo_hands_factory():
    """The usual hands factory; without a working sandbox, plain local hands, said out loud.

    Only the demo may fall back: its code is fixed and ships with the package, while a
    session with a model refuses to run code until the sandbox works.
    """
    import dataclasses

    from .config import from_env
    from .hands.factory import HandsFactory, HandsSettings
    from .hands.preflight import preflight
    from .hands.sandbox import SandboxSettings

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
    return HandsFactory(settings)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="A Jupyter-native agent workbench.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=None, help="the DuckDB session log (default: $WORKBENCH_DB or the Jupyter data dir)")

    r = sub.add_parser("run", parents=[db], help="run one user turn to completion")
    r.add_argument("prompt", help="what to tell the agent")
    r.add_argument("--session", help="session id: created if new, continued if it exists")
    r.add_argument("--model", help="scripted[:SCRIPT], claude-..., or anthropic:NAME (default: claude-opus-5-5 with a key, else scripted)")
    r.add_argument("--thinking", action="store_true", help="also print thinking text (to stderr) as it streams")
    r.set_defaults(fn=cmd_run)

    r = sub.add_parser("resume", parents=[db], help="finish a turn that was cut off")
    r.add_argument("id", help="session id")
    r.set_defaults(fn=cmd_resume)

    r = sub.add_parser("sessions", parents=[db], help="list sessions")
    r.add_argument("--json", action="store_true", help="one JSON object per line")
    r.set_defaults(fn=cmd_sessions)

    r = sub.add_parser("show", parents=[db], help="show a session's events, readable")
    r.add_argument("id", help="session id")
    r.set_defaults(fn=cmd_show)

    r = sub.add_parser("export", parents=[db], help="a session's events as JSON lines")
    r.add_argument("id", help="session id")
    r.set_defaults(fn=cmd_export)

    r = sub.add_parser("demo", parents=[db], help="offline demo: a short data analysis in a real kernel")
    r.set_defaults(fn=cmd_demo)
    from .memory import cli as _memory_commands  # noqa: F401  (dream, memories, memory, review)

    for register in EXTRA_COMMANDS:
        register(sub, db)
    return p


# Other modules (dreaming, review panels) add their commands here.
EXTRA_COMMANDS: list[Callable[[Any, argparse.ArgumentParser], None]] = []


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("jupyter-workbench")
    except Exception:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except WorkbenchError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    # run the package's module, not this __main__ copy, so commands registered by other modules show up
    from workbench.cli import main as _main

    sys.exit(_main())
