"""`workbench dream`, `workbench memories`, `workbench memory ID` and `workbench review`."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from ..plugins import Command, CommandContext
from ..plugins.errors import ConfigError
from ..plugins.settings import argument
from ..plugins.text import one_line, table
from .store import DEFAULT_STORE, REVIEW_ACTIONS, STATUSES, check_store, os_user

if TYPE_CHECKING:  # the plugin imports this module for its commands
    from ..plugins import PluginHost as Host
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
    host = ctx.build_host(args, hands=False)  # a dream reads sessions and runs no code: no kernel, no sandbox check
    plugin = memory_plugin(host)
    dream_id: str | None = None
    titles: list[tuple[str, dict[str, Any]]] = []

    async def go() -> dict[str, Any]:
        nonlocal dream_id
        try:
            store = plugin.require_store()
            dream_id = await plugin.create_dream(args.sessions, args.model, args.instructions, args.store)
            print(f"dream {dream_id} (model {store.log.session(dream_id)['model']})", file=sys.stderr)
            await host.start()
            stop = ctx.follow(host, dream_id)
            try:
                result = await plugin.run_dream(dream_id, args.instructions)
            finally:
                stop()
            if result["stop_reason"] == "end_turn":  # what it proposed, as committed, read before the file closes
                titles.extend(await asyncio.to_thread(lambda: [(mid, store.get(mid)) for mid in result["proposed"]]))
            return result
        finally:
            await host.close()

    try:
        result = ctx.run(go)
    except KeyboardInterrupt:
        print(f"\nworkbench: dream {dream_id} interrupted; its finished chunks are committed (resume it to go on)", file=sys.stderr)
        return 130
    if result["stop_reason"] != "end_turn":
        return _dream_stopped(dream_id, result)
    print(f"\ndream {dream_id} ended ({result['stop_reason']}): {len(result['proposed'])} proposal(s); "
          f"read {', '.join(f'{s} to #{n}' for s, n in result['read'].items()) or 'nothing new'}")
    if titles:
        _print_proposals(titles, plugin.require_store().log.path)
    return EXIT_OK


def _dream_stopped(dream_id: str | None, result: dict[str, Any]) -> int:
    print(f"\nworkbench: dream {dream_id} stopped ({result['stop_reason']}); the chunks it finished are committed, "
          f"nothing of the chunk it was in: `workbench resume {dream_id}` reads that chunk again and goes on", file=sys.stderr)
    return 1


def _print_proposals(memories: list[tuple[str, dict[str, Any]]], db: Any) -> None:
    for mid, m in memories:
        print(f"  {mid}  {m['proposal']:<7} {one_line(m['title'], 100)}")
    print(f"review them with `workbench review --db {db}` or `workbench memories --status proposed`")


# -- through the server that holds the database (workbench/cli/remote.py) --------------------------


def remote_dream(args: argparse.Namespace, r: Any) -> int:
    """The dream runs in the server; its events stream here, its result is read when it is committed."""
    from ..plugins.cli import Printer
    from ..plugins.errors import UnknownMemory

    with r.answers():
        dream_id = r.client.dream(args.sessions, args.model, args.instructions, args.store)
        print(f"dream {dream_id} (model {r.client.session(dream_id)['model']})", file=sys.stderr)
    printer = Printer(dream_id)
    try:
        _follow_dream(r, dream_id, printer)
        with r.answers(UnknownMemory):
            result = r.client.dream_status(dream_id)
            while result["state"] == "running":  # the last chunk's commit, a moment after its events
                time.sleep(0.2)
                result = r.client.dream_status(dream_id)
    except KeyboardInterrupt:
        r.interrupt(dream_id)
        print(f"\nworkbench: dream {dream_id} interrupted; its finished chunks are committed (resume it to go on)",
              file=sys.stderr)
        return 130
    if result["state"] != "done":
        return _dream_stopped(dream_id, {**result, "stop_reason": result["stop_reason"] or result["state"]})
    proposed = [(m["id"], m) for m in result["proposals"]]
    print(f"\ndream {dream_id} ended ({result['stop_reason'] or 'end_turn'}): {len(proposed)} proposal(s); "
          f"read {', '.join(f'{s} to #{n}' for s, n in result['read'].items()) or 'nothing new'}")
    if proposed:
        _print_proposals(proposed, args.db or r.client.status()["db"])
    return EXIT_OK


def _follow_dream(r: Any, dream_id: str, printer: Any) -> None:
    """Print the dream's events as the server writes them, chunk after chunk, until it ends or stops."""
    from ..plugins.cli import event_of

    with r.client.stream(dream_id, after=0) as stream:
        for msg in stream:
            if msg["kind"] == "delta":
                printer.delta(msg.get("session_id") or dream_id, msg["event"])
                continue
            if msg["kind"] != "event":
                continue
            ev = event_of(msg["event"])
            printer.event(ev)
            if ev.type in ("dream_ended", "dream_cancelled") or (
                    ev.type == "turn_ended" and ev.payload.get("stop_reason") != "end_turn"):
                return


def remote_memories(args: argparse.Namespace, r: Any) -> int:
    from ..plugins.errors import UnknownMemory

    _check_verb(args)
    if args.verb == "export":
        with r.answers(UnknownMemory):
            doc = r.client.export_memories(args.store or DEFAULT_STORE)
        return _write_export(args, doc)
    if args.verb == "import":
        data = _read_export(args.file)
        with r.answers():
            report = r.client.import_memories(data, args.store, allow_secret=args.allow_secret, review=args.review)
        return _print_import(args, report)
    with r.answers():
        rows = r.client.memories(status=args.status, tag=args.tag, dream=args.dream, store=args.store)
    return _print_memories(args, rows)


def remote_memory(args: argparse.Namespace, r: Any) -> int:
    from ..plugins.errors import UnknownMemory

    with r.answers(UnknownMemory):
        fields = _review_fields(args)
        if args.action:  # the server records the user its token authenticates as the actor
            r.client.review(args.id, args.action, **fields)
        m = r.client.memory(args.id)
    quotes = {}
    for c in m["provenance"]:
        found = r.events(c["session_id"], after=c["seq"] - 1, limit=1) if r.session(c["session_id"]) is not None else []
        quotes[(c["session_id"], c["seq"])] = found[0].type if found and found[0].seq == c["seq"] else "missing"
    return _print_memory(args, m, quotes)


def remote_review(args: argparse.Namespace, r: Any) -> int:
    from ..plugins.errors import DatabaseLocked

    raise DatabaseLocked(
        f"the workbench server at {r.client.url} holds the database, and this review panel needs the file itself: "
        "review in that server's JupyterLab (workbench sidebar, Memories tab), with `workbench memory ID --action ...`, "
        "or stop the server first"
    )


def cmd_dreams(args: argparse.Namespace, ctx: CommandContext) -> int:
    from .dream import cancel_dream, list_dreams

    if args.cancel:
        host = ctx.build_host(args, hands=False)
        try:
            cancelled = cancel_dream(memory_plugin(host).require_store(), args.cancel, os_user())
        finally:
            ctx.run(host.close)
        print(f"dream {args.cancel} {'cancelled' if cancelled else 'had already ended or been cancelled'}", file=sys.stderr)
        return EXIT_OK
    host, plugin = _read_only(args, ctx)
    try:
        rows = list_dreams(plugin.require_store())
    finally:
        ctx.run(host.close)
    return _print_dreams(args, rows)


def remote_dreams(args: argparse.Namespace, r: Any) -> int:
    from ..plugins.errors import UnknownSession

    if args.cancel:
        with r.answers(UnknownSession):
            status = r.client.cancel_dream(args.cancel)
        print(f"dream {args.cancel} {'cancelled' if status['cancelled'] else 'had already ended or been cancelled'}", file=sys.stderr)
        return EXIT_OK
    with r.answers():
        rows = r.client.dreams()
    return _print_dreams(args, rows)


def _print_dreams(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    if args.json:
        for d in rows:
            print(json.dumps(d, ensure_ascii=False, default=str))
    elif not rows:
        print("no dreams yet: start one with `workbench dream`", file=sys.stderr)
    else:
        print(table([(d["id"], str(d["created_at"])[:19], d["state"], d["chunks"], d["proposals"], d["title"]) for d in rows],
                    ("id", "created (UTC)", "state", "chunks", "proposed", "title"), (14, 19, 10, 6, 8)))
    return EXIT_OK


def cmd_memories(args: argparse.Namespace, ctx: CommandContext) -> int:
    from .transfer import export_store, import_store

    _check_verb(args)
    if args.verb == "import":
        data = _read_export(args.file)  # before the database is opened: a bad file changes nothing
        host = ctx.build_host(args, hands=False)
        try:
            report = import_store(memory_plugin(host).require_store(), data, os_user(), args.store,
                                  allow_secret=args.allow_secret, review=args.review)
        finally:
            ctx.run(host.close)
        return _print_import(args, report)
    host, plugin = _read_only(args, ctx)
    try:
        if args.verb == "export":
            doc = export_store(plugin.require_store(), args.store or DEFAULT_STORE, os_user())
        else:
            rows = plugin.require_store().list(status=args.status, tag=args.tag, dream=args.dream, store=args.store)
    finally:
        ctx.run(host.close)
    if args.verb == "export":
        return _write_export(args, doc)
    return _print_memories(args, rows)


def _check_verb(args: argparse.Namespace) -> None:
    """The options of `memories`, `memories export` and `memories import` go with their own verb only."""
    if args.store is not None:
        check_store(args.store)
    if args.verb == "import" and not args.file:
        raise ConfigError("`workbench memories import FILE`: name the export file to read")
    if args.verb != "import" and args.file:
        raise ConfigError(f"{args.file[:80]!r}: a file goes with `workbench memories import FILE` only")
    if args.verb != "export" and args.output:
        raise ConfigError("-o/--output goes with `workbench memories export` only")
    if args.verb != "import" and args.allow_secret:
        raise ConfigError("--allow-secret goes with `workbench memories import` only")
    if args.verb != "import" and args.review:
        raise ConfigError("--review goes with `workbench memories import` only")
    listing = [k for k in ("status", "tag", "dream") if getattr(args, k)]
    if args.verb and listing:
        raise ConfigError(f"--{listing[0]} filters the listing; `workbench memories {args.verb}` takes a whole store")


def _read_export(path: str) -> bytes:
    """An export file's bytes (at most the format's limit: a bigger one is refused before it is read)."""
    from pathlib import Path

    from .transfer import MAX_FILE_BYTES

    p = Path(path)
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise ConfigError(f"{path[:200]!r} is not a file")
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path[:200]!r} is {size:,} bytes; an export takes at most {MAX_FILE_BYTES:,}")
        with p.open("rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {path[:200]!r}: {e.strerror or e}") from None


def _write_export(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
    if not args.output or args.output == "-":
        sys.stdout.write(text)
    else:
        import os
        from pathlib import Path

        out = Path(args.output)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)  # whole or not at all: a reader never sees half an export
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ConfigError(f"cannot write {args.output[:200]!r}: {e.strerror or e}") from None
    print(f"exported store {doc['store']}: {len(doc['memories'])} memories, "
          f"{sum(len(m['versions']) for m in doc['memories'])} versions, {len(doc['links'])} links"
          + (f" to {args.output}" if args.output and args.output != "-" else ""), file=sys.stderr)
    return EXIT_OK


def _print_import(args: argparse.Namespace, report: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
        return EXIT_OK
    print(f"imported {len(report['imported'])} memories ({report['versions']} versions, {report['links']} links) "
          f"into store {report['store']} from store {report['source_store']}, as {report['actor']} "
          f"(import {report['import_id']})")
    for s in report["skipped"]:
        print(f"  skipped {s['id']}: {s['why']}")
    if report.get("to_review"):
        print(f"  {len(report['to_review'])} accepted in the file came in as proposals: review them "
              f"(`workbench memories --store {report['store']} --status proposed`)")
    return EXIT_OK


def _print_memories(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
        return EXIT_OK
    if not rows:
        with_status = f" with status {args.status}" if args.status else ""
        in_store = f" in store {args.store}" if getattr(args, "store", None) else ""
        print(f"no memories{with_status}{in_store}: start a dream with `workbench dream`", file=sys.stderr)
        return EXIT_OK
    print(table([(m["id"], m.get("store", DEFAULT_STORE), m["status"], m["proposal"], m["version"], ",".join(m["tags"]), m["title"])
                 for m in rows], ("id", "store", "status", "kind", "v", "tags", "title"), (12, 12, 10, 7, 2, 20)))
    conflicting = [m for m in rows if m.get("conflicts")]
    if conflicting:
        print("\ncontradictions (side by side; resolve with `workbench memory OLD --action supersede --by NEW`):")
    for m in conflicting:
        for c in m["conflicts"]:
            print(f"  {m['id']} ({m['status']}, {m['updated_at'][:10]}) {one_line(m['title'], 60)}\n"
                  f"    vs {c['id']} ({c['status']}, {c['updated_at'][:10]}) {one_line(c['title'], 60)}\n"
                  f"    why: {one_line(c['why'], 160)}")
    return EXIT_OK


def cmd_memory(args: argparse.Namespace, ctx: CommandContext) -> int:
    fields = _review_fields(args)
    host = ctx.build_host(args, read_only=args.action is None, hands=False)
    try:
        store = memory_plugin(host).require_store()
        if args.action:
            store.review(args.id, args.action, os_user(), **fields)
        m = store.get(args.id)
        quotes = {}
        for c in m["provenance"]:
            found = store.log.events(c["session_id"], after=c["seq"] - 1, until=c["seq"]) if store.log.has_session(c["session_id"]) else []
            quotes[(c["session_id"], c["seq"])] = found[0].type if found else "missing"
    finally:
        ctx.run(host.close)
    return _print_memory(args, m, quotes)


def _review_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of the review action the command's options give (the actor is never one of them)."""
    edits = {"title": args.title, "text": args.text, "tags": args.tags.split(",") if args.tags is not None else None}
    allowed = {"edit": {"title", "text", "tags"}, "accept": {"title", "text", "tags"}, "redact": {"title"}}.get(args.action, set())
    wrong = sorted(k for k, v in edits.items() if v is not None and k not in allowed)
    if wrong:
        raise ConfigError(f"--{', --'.join(wrong)} cannot go with {'--action ' + args.action if args.action else 'no --action'}: "
                          "titles and texts change with --action edit (or accept), a title also with redact")
    if args.by is not None and args.action != "supersede":
        raise ConfigError("--by goes with --action supersede: the newer, accepted memory that replaces this one")
    if args.action == "supersede" and not args.by:
        raise ConfigError("--action supersede needs --by NEW: the newer, accepted memory that replaces this one")
    fields: dict[str, Any] = {"reason" if args.action == "redact" else "note": args.note, **edits}
    if args.action == "supersede":
        fields["by"] = args.by
    if args.allow_secret:
        fields["allow_secret"] = True
    return {k: v for k, v in fields.items() if v is not None}


def _print_memory(args: argparse.Namespace, m: dict[str, Any], quotes: dict[tuple[str, int], str]) -> int:
    if args.json:
        print(json.dumps(m, ensure_ascii=False, indent=1))
        return EXIT_OK
    of = " of " + ", ".join(m["targets"]) if m["targets"] else ""
    print(f"{m['id']}  {m['status']}  ({m['proposal']}{of})  store: {m.get('store', DEFAULT_STORE)}  tags: {', '.join(m['tags'])}")
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
    for key, says in (("supersedes", "replaced"), ("superseded_by", "replaced by")):
        for link in m.get(key) or []:
            print(f"  {says} {link['id']} ({link['status']}) {one_line(link['title'] or '', 60)!r}: "
                  f"{link['kind']} by {link['actor']} at {link['ts'][:19]}")
    if m.get("current") and m["current"] != m["id"]:
        print(f"  in effect now: {m['current']}")
    for c in m.get("conflicts") or []:
        print(f"\ncontradicts {c['id']} ({c['status']}, {c['updated_at'][:10]}): {one_line(c['title'], 80)}\n  {one_line(c['text'], 200)}"
              f"\n  why: {c['why']}")
    return EXIT_OK


def cmd_review(args: argparse.Namespace, ctx: CommandContext) -> int:
    # the file first: a server that holds it is DatabaseLocked (a clear message) before Panel's import, which is
    # 1.7 s of CPU on a 2-core machine
    host = ctx.build_host(args, hands=False)

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    try:
        store = memory_plugin(host).require_store()
        from .panels.review import serve_review

        signal.signal(signal.SIGTERM, stop)  # so the log is checkpointed and closed on SIGTERM too
        print("memory review: Ctrl-C stops it; the URL below carries a token that is new at every launch",
              file=sys.stderr, flush=True)
        serve_review(store, port=args.port, show=False, actor=os_user())
    except KeyboardInterrupt:
        pass
    finally:
        ctx.run(host.close)
    return EXIT_OK


def _dream_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--sessions", nargs="+", metavar="ID", help="the sessions to read (default: every chat session)")
    r.add_argument("--model", help="the dream's model (default: dream_model, else the default model; scripted:dream runs offline)")
    r.add_argument("--instructions", help="what to look for (default: anything new worth remembering)")
    r.add_argument("--store", metavar="NAME", help="the memory store its proposals go into (default: dream_store, 'default')")


def _dreams_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--cancel", metavar="ID", help="cancel this dream: no later chunk runs, no resume or server start goes on with it")
    r.add_argument("--json", action="store_true", help="one JSON object per line")


def _memories_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("verb", nargs="?", choices=("export", "import"),
                   help="export: write a store as JSON; import FILE: read one (default: list memories)")
    r.add_argument("file", nargs="?", help="with import: the export file to read")
    r.add_argument("--store", metavar="NAME", help="list: only this store's memories; export: the store to write "
                                                   "(default: default); import: the store to import into (default: the file's)")
    r.add_argument("-o", "--output", metavar="FILE", help="with export: write to FILE (default: standard output)")
    r.add_argument("--allow-secret", action="store_true", help="with import: keep fields that look like a secret (it is not one)")
    r.add_argument("--review", action="store_true", help="with import: accepted memories come in as proposals, "
                                                         "told to no session until a person accepts them here")
    r.add_argument("--status", choices=STATUSES)
    r.add_argument("--tag")
    r.add_argument("--dream", metavar="ID", help="only what this dream proposed")
    r.add_argument("--json", action="store_true", help="one JSON object per line")


def _memory_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("id")
    r.add_argument("--action", choices=[a for a in REVIEW_ACTIONS if a != "merge"],
                   help="a review action to apply first, as you (person:<your OS user>; through a server: its authenticated user)")
    r.add_argument("--title", help="the new title (edit, accept, redact)")
    r.add_argument("--text", help="the new text (edit, accept)")
    r.add_argument("--tags", help="the new tags, comma-separated (edit, accept)")
    r.add_argument("--note", help="why (required for redact)")
    r.add_argument("--allow-secret", action="store_true", help="store a title or text that looks like a secret (it is not one)")
    r.add_argument("--by", metavar="NEW", help="with --action supersede: the newer, accepted memory that replaces this one")
    r.add_argument("--json", action="store_true")


def _review_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--port", type=argument(int), default=5006)


COMMANDS = (
    Command("dream", "run a dream: read sessions and propose memories for review", _dream_args, cmd_dream, remote=remote_dream),
    Command("dreams", "list dreams with their state; --cancel one", _dreams_args, cmd_dreams, remote=remote_dreams),
    Command("memories", "list memories; export a store as JSON, import one", _memories_args, cmd_memories,
            remote=remote_memories),
    Command("memory", "one memory: text, provenance and history; optionally review it", _memory_args, cmd_memory,
            remote=remote_memory),
    Command("review", "serve the memory review panel on 127.0.0.1", _review_args, cmd_review, remote=remote_review),
)
