"""`workbench dream`, `workbench memories`, `workbench memory ID` and `workbench review`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, cast

from ..plugins import Command, CommandContext
from ..render import one_line, table
from .store import REVIEW_ACTIONS, STATUSES

if TYPE_CHECKING:  # the plugin imports this module for its commands
    from ..host import Host
    from .plugin import MemoryPlugin

EXIT_OK = 0


def memory_plugin(host: Host) -> MemoryPlugin:
    """The host's memory plugin, the one whose commands these are (plugin and command names are unique)."""
    return cast("MemoryPlugin", host.plugin("memory"))


def _read_only(args: argparse.Namespace, ctx: CommandContext) -> tuple[Host, MemoryPlugin]:
    """A host that runs no code, over --db, read-only: (host, its memory plugin)."""
    host = ctx.build_host(args, read_only=True, hands=False)
    return host, memory_plugin(host)


def cmd_dream(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = ctx.build_host(args)
    plugin = memory_plugin(host)
    dream_id: str | None = None

    async def go() -> dict[str, Any]:
        nonlocal dream_id
        try:
            store = plugin.require_store()
            dream_id = await plugin.create_dream(args.sessions, args.model)
            print(f"dream {dream_id} (model {store.log.session(dream_id)['model']})", file=sys.stderr)
            await host.start()
            stop = ctx.follow(host, dream_id)
            try:
                return await plugin.run_dream(dream_id, args.instructions)
            finally:
                stop()
        finally:
            await host.close()

    try:
        result = ctx.run(go)
    except KeyboardInterrupt:
        print(f"\nworkbench: dream {dream_id} interrupted; nothing it staged was proposed", file=sys.stderr)
        return 130
    if result["stop_reason"] != "end_turn":
        print(f"\nworkbench: dream {dream_id} stopped ({result['stop_reason']}); nothing it staged was proposed "
              "and its reading was not recorded, so the next dream reads the same events", file=sys.stderr)
        return 1
    print(f"\ndream {dream_id} ended ({result['stop_reason']}): {len(result['proposed'])} proposal(s); "
          f"read {', '.join(f'{s} to #{n}' for s, n in result['read'].items()) or 'nothing new'}")
    if result["proposed"]:
        host, plugin = _read_only(args, ctx)
        try:
            for mid in result["proposed"]:
                m = plugin.require_store().get(mid)
                print(f"  {mid}  {m['proposal']:<7} {one_line(m['title'], 100)}")
        finally:
            ctx.run(host.close)
        print(f"review them with `workbench review --db {host.log.path}` or `workbench memories --status proposed`")
    return EXIT_OK


def cmd_memories(args: argparse.Namespace, ctx: CommandContext) -> int:
    host, plugin = _read_only(args, ctx)
    try:
        rows = plugin.require_store().list(status=args.status, tag=args.tag, dream=args.dream)
    finally:
        ctx.run(host.close)
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
        return EXIT_OK
    if not rows:
        with_status = f" with status {args.status}" if args.status else ""
        print(f"no memories{with_status}: start a dream with `workbench dream`", file=sys.stderr)
        return EXIT_OK
    print(table([(m["id"], m["status"], m["proposal"], m["version"], ",".join(m["tags"]), m["title"]) for m in rows],
                ("id", "status", "kind", "v", "tags", "title"), (12, 10, 7, 2, 20)))
    return EXIT_OK


def cmd_memory(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = ctx.build_host(args, read_only=args.action is None, hands=False)
    try:
        store = memory_plugin(host).require_store()
        if args.action:
            extra = {"reason": args.note} if args.action == "redact" else {"note": args.note}
            store.review(args.id, args.action, args.actor, **extra)
        m = store.get(args.id)
        quotes = {}
        for c in m["provenance"]:
            found = store.log.events(c["session_id"], after=c["seq"] - 1, until=c["seq"]) if store.log.has_session(c["session_id"]) else []
            quotes[(c["session_id"], c["seq"])] = found[0].type if found else "missing"
    finally:
        ctx.run(host.close)
    if args.json:
        print(json.dumps(m, ensure_ascii=False, indent=1))
        return EXIT_OK
    of = " of " + ", ".join(m["targets"]) if m["targets"] else ""
    print(f"{m['id']}  {m['status']}  ({m['proposal']}{of})  tags: {', '.join(m['tags'])}")
    print(f"title: {m['title']}\n\n{m['text']}\n\nprovenance:")
    if not m["provenance"]:
        print("  (none)")
    for c in m["provenance"]:
        quote = f": {c['quote']!r}" if c.get("quote") else ""
        print(f"  {c['session_id']} #{c['seq']} ({quotes[(c['session_id'], c['seq'])]}){quote}")
    print("\nhistory:")
    for v in m["history"]:
        note = f"  ({v['note']})" if v["note"] else ""
        print(f"  v{v['version']} {v['ts'][:19]} {v['actor']:<24} {v['action']:<9} -> {v['status']}{note}")
    for r in m["redactions"]:
        print(f"  redacted versions {r['versions']} at {r['ts'][:19]} by {r['actor']}: {r['reason']}")
    return EXIT_OK


def cmd_review(args: argparse.Namespace, ctx: CommandContext) -> int:
    from ..panels.review import serve_review

    host = ctx.build_host(args, hands=False)  # DatabaseLocked (a clear message) when a server holds the file
    store = memory_plugin(host).require_store()

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # so the log is checkpointed and closed on SIGTERM too
    print("memory review: Ctrl-C stops it; the URL below carries a token that is new at every launch",
          file=sys.stderr, flush=True)
    try:
        serve_review(store, port=args.port, show=False, actor=args.actor)
    except KeyboardInterrupt:
        pass
    finally:
        ctx.run(host.close)
    return EXIT_OK


def _dream_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--sessions", nargs="+", metavar="ID", help="the sessions to read (default: every chat session)")
    r.add_argument("--model", help="the dream's model (default: dream_model, else the default model; scripted:dream runs offline)")
    r.add_argument("--instructions", help="what to look for (default: anything new worth remembering)")


def _memories_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--status", choices=STATUSES)
    r.add_argument("--tag")
    r.add_argument("--dream", metavar="ID", help="only what this dream proposed")
    r.add_argument("--json", action="store_true", help="one JSON object per line")


def _memory_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("id")
    r.add_argument("--action", choices=[a for a in REVIEW_ACTIONS if a not in ("edit", "merge")], help="a review action to apply first")
    r.add_argument("--note", help="why (required for redact)")
    r.add_argument("--actor", default=f"person:{os.environ.get('USER') or 'cli'}", help="who reviews (default: person:$USER)")
    r.add_argument("--json", action="store_true")


def _review_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--port", type=int, default=5006)
    r.add_argument("--actor", default=f"person:{os.environ.get('USER') or 'reviewer'}", help="who reviews (default: person:$USER)")


COMMANDS = (
    Command("dream", "run a dream: read sessions and propose memories for review", _dream_args, cmd_dream),
    Command("memories", "list memories", _memories_args, cmd_memories),
    Command("memory", "one memory: text, provenance and history; optionally review it", _memory_args, cmd_memory),
    Command("review", "serve the memory review panel on 127.0.0.1", _review_args, cmd_review),
)
