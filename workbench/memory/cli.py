"""`workbench dream`, `workbench memories`, `workbench memory ID` and `workbench review`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from ..cli import EXIT_OK, EXTRA_COMMANDS, Printer, _run_async
from ..config import from_env
from .store import REVIEW_ACTIONS, STATUSES, MemorySettings


def _store(args: argparse.Namespace, read_only: bool):
    from ..log import SessionLog
    from .store import MemoryStore

    return MemoryStore(SessionLog(args.db, read_only=read_only), from_env(MemorySettings, prefix="WORKBENCH_MEMORY_"))


def cmd_dream(args: argparse.Namespace) -> int:
    from ..brain import Brain
    from ..brain.models import check_model_name
    from .dream import create_dream, run_dream

    store = _store(args, read_only=False)
    try:
        brain = Brain(store.log)
        brain.extras["memory"] = store
        if args.model:
            check_model_name(args.model)
        dream_id = create_dream(brain, sessions=args.sessions, model=args.model)
        print(f"dream {dream_id} (model {store.log.session(dream_id)['model']})", file=sys.stderr)
        printer = Printer(dream_id)
        brain.listen(printer.delta)
        store.log.subscribe(printer.event)

        async def go() -> dict[str, Any]:
            try:
                return await run_dream(brain, dream_id=dream_id, instructions=args.instructions)
            finally:
                await brain.close()

        try:
            result = _run_async(go)
        except KeyboardInterrupt:
            print(f"\nworkbench: dream {dream_id} interrupted; nothing it staged was proposed", file=sys.stderr)
            return 130
        if result["stop_reason"] != "end_turn":
            print(f"\nworkbench: dream {dream_id} stopped ({result['stop_reason']}); nothing it staged was proposed "
                  "and its reading was not recorded, so the next dream reads the same events", file=sys.stderr)
            return 1
        print(f"\ndream {dream_id} ended ({result['stop_reason']}): {len(result['proposed'])} proposal(s); "
              f"read {', '.join(f'{s} to #{n}' for s, n in result['read'].items()) or 'nothing new'}")
        for mid in result["proposed"]:
            m = store.get(mid)
            print(f"  {mid}  {m['proposal']:<7} {m['title']}")
        if result["proposed"]:
            print(f"review them with `workbench review --db {store.log.path}` or `workbench memories --status proposed`")
        return EXIT_OK
    finally:
        store.log.close()


def cmd_memories(args: argparse.Namespace) -> int:
    store = _store(args, read_only=True)
    try:
        rows = store.list(status=args.status, tag=args.tag, dream=args.dream)
    finally:
        store.log.close()
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
        return EXIT_OK
    if not rows:
        print("no memories" + (f" with status {args.status}" if args.status else "") + ": start a dream with `workbench dream`", file=sys.stderr)
        return EXIT_OK
    print(f"{'id':<12} {'status':<10} {'kind':<7} {'v':>2}  {'tags':<20} title")
    for m in rows:
        print(f"{m['id']:<12} {m['status']:<10} {m['proposal']:<7} {m['version']:>2}  {','.join(m['tags'])[:20]:<20} {m['title']}")
    return EXIT_OK


def cmd_memory(args: argparse.Namespace) -> int:
    store = _store(args, read_only=args.action is None)
    try:
        if args.action:
            extra = {"reason": args.note} if args.action == "redact" else {"note": args.note}
            store.review(args.id, args.action, args.actor, **extra)
        m = store.get(args.id)
        quotes = {}
        for c in m["provenance"]:
            found = store.log.events(c["session_id"], after=c["seq"] - 1, until=c["seq"]) if store.log.has_session(c["session_id"]) else []
            quotes[(c["session_id"], c["seq"])] = found[0].type if found else "missing"
    finally:
        store.log.close()
    if args.json:
        print(json.dumps(m, ensure_ascii=False, indent=1))
        return EXIT_OK
    print(f"{m['id']}  {m['status']}  ({m['proposal']}{' of ' + ', '.join(m['targets']) if m['targets'] else ''})  tags: {', '.join(m['tags'])}")
    print(f"title: {m['title']}\n\n{m['text']}\n\nprovenance:")
    if not m["provenance"]:
        print("  (none)")
    for c in m["provenance"]:
        quote = f": {c['quote']!r}" if c.get("quote") else ""
        print(f"  {c['session_id']} #{c['seq']} ({quotes[(c['session_id'], c['seq'])]}){quote}")
    print("\nhistory:")
    for v in m["history"]:
        print(f"  v{v['version']} {v['ts'][:19]} {v['actor']:<24} {v['action']:<9} -> {v['status']}" + (f"  ({v['note']})" if v["note"] else ""))
    for r in m["redactions"]:
        print(f"  redacted versions {r['versions']} at {r['ts'][:19]} by {r['actor']}: {r['reason']}")
    return EXIT_OK


def cmd_review(args: argparse.Namespace) -> int:
    from ..panels.review import serve_review

    store = _store(args, read_only=False)  # DatabaseLocked (a clear message) when a server holds the file

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # so the log is checkpointed and closed on SIGTERM too
    print(f"memory review on http://127.0.0.1:{args.port}/review (Ctrl-C stops it)", file=sys.stderr, flush=True)
    try:
        serve_review(store, port=args.port, show=False, actor=args.actor)
    except KeyboardInterrupt:
        pass
    finally:
        store.log.close()
    return EXIT_OK


def register(sub: Any, db: argparse.ArgumentParser) -> None:
    """Add the memory commands to the `workbench` parser."""
    r = sub.add_parser("dream", parents=[db], help="run a dream: read sessions and propose memories for review")
    r.add_argument("--sessions", nargs="+", metavar="ID", help="the sessions to read (default: every chat session)")
    r.add_argument("--model", help="the dream's model (default: dream_model, else the default model; scripted:dream runs offline)")
    r.add_argument("--instructions", help="what to look for (default: anything new worth remembering)")
    r.set_defaults(fn=cmd_dream)

    r = sub.add_parser("memories", parents=[db], help="list memories")
    r.add_argument("--status", choices=STATUSES)
    r.add_argument("--tag")
    r.add_argument("--dream", metavar="ID", help="only what this dream proposed")
    r.add_argument("--json", action="store_true", help="one JSON object per line")
    r.set_defaults(fn=cmd_memories)

    r = sub.add_parser("memory", parents=[db], help="one memory: text, provenance and history; optionally review it")
    r.add_argument("id")
    r.add_argument("--action", choices=[a for a in REVIEW_ACTIONS if a not in ("edit", "merge")], help="a review action to apply first")
    r.add_argument("--note", help="why (required for redact)")
    r.add_argument("--actor", default=f"person:{os.environ.get('USER') or 'cli'}", help="who reviews (default: person:$USER)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_memory)

    r = sub.add_parser("review", parents=[db], help="serve the memory review panel on 127.0.0.1")
    r.add_argument("--port", type=int, default=5006)
    r.add_argument("--actor", default=f"person:{os.environ.get('USER') or 'reviewer'}", help="who reviews (default: person:$USER)")
    r.set_defaults(fn=cmd_review)


EXTRA_COMMANDS.append(register)
