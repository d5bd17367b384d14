"""Commands that manage sessions: rename, archive, unarchive, delete, fork, search, usage, models.

Each runs on the database itself or, when a workbench server holds it, through the server's REST
API (cli/remote.py) with the same output and the same errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, InvalidPayload
from ..plugins import Command, CommandContext
from ..render import one_line, table
from ..strictnum import argument
from ..usage import describe, session_usage
from .console import EXIT_ERROR, EXIT_OK
from .remote import Remote


def _writing(args: argparse.Namespace, ctx: CommandContext, fn: Callable[[Any], Any], read_only: bool = False) -> Any:
    """fn(host) on a host of the command's database (opened for writing unless read_only), without hands;
    closed after. A ValueError of the log (a bad argument) is a ConfigError: exit 2 with its message."""
    host = ctx.build_host(args, read_only=read_only, hands=False)
    try:
        try:
            return fn(host)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    finally:
        ctx.run(host.close)


def _reading(args: argparse.Namespace, ctx: CommandContext, fn: Callable[[Any], Any]) -> Any:
    return _writing(args, ctx, fn, read_only=True)


def _said(args: argparse.Namespace, row: dict[str, Any], what: str) -> int:
    if getattr(args, "json", False):
        row.pop("running", None)
        print(json.dumps(row, ensure_ascii=False))
    else:
        print(f"{what} session {row['id']}: {one_line(row.get('title') or '(untitled)', 100)}")
    return EXIT_OK


# -- rename, archive, unarchive -------------------------------------------------------------------------


def _title(args: argparse.Namespace) -> str:
    title = " ".join(args.title)
    if not title.strip():
        raise InvalidPayload("the session's title must not be blank")
    return title


def cmd_rename(args: argparse.Namespace, ctx: CommandContext) -> int:
    title = _title(args)
    row = _writing(args, ctx, lambda h: (h.log.rename_session(args.id, title), h.log.session(args.id))[1])
    return _said(args, row, "renamed")


def remote_rename(args: argparse.Namespace, r: Remote) -> int:
    with r.answers():
        return _said(args, r.client.rename(args.id, _title(args)), "renamed")


def _archiver(archived: bool) -> tuple[Callable[..., int], Callable[..., int]]:
    word = "archived" if archived else "unarchived"

    def local(args: argparse.Namespace, ctx: CommandContext) -> int:
        row = _writing(args, ctx, lambda h: (h.log.archive_session(args.id, archived), h.log.session(args.id))[1])
        return _said(args, row, word)

    def remote(args: argparse.Namespace, r: Remote) -> int:
        with r.answers():
            return _said(args, r.client.archive(args.id, archived), word)

    return local, remote


# -- delete ---------------------------------------------------------------------------------------------


def _confirmed(args: argparse.Namespace, row: dict[str, Any] | None) -> bool:
    """--yes, or a person at a terminal typing the session's id; never a silent yes from a pipe."""
    if args.yes or row is None:
        return True
    if not sys.stdin.isatty():
        print("workbench: error: deleting removes the session's events for good; pass --yes to confirm "
              "(stdin is not a terminal to ask)", file=sys.stderr)
        return False
    print(f"Delete session {row['id']} ({one_line(row.get('title') or 'untitled', 60)}, {row['events']} events)? "
          "Its events are removed for good.", file=sys.stderr)
    try:
        answer = input(f"Type its id ({row['id']}) to confirm: ")
    except EOFError:
        return False
    return answer.strip() == row["id"]


def _deleted(out: dict[str, Any]) -> int:
    print(f"deleted session {out['deleted']} ({out['events']} events)")
    return EXIT_OK


def cmd_delete(args: argparse.Namespace, ctx: CommandContext) -> int:
    def go(host: Any) -> int:
        row = host.log.session(args.id)  # UnknownSession first
        if not _confirmed(args, row):
            return EXIT_ERROR
        # no turn runs in this process: an open turn in the log is one a dead process left (resumable, not running)
        n = host.log.delete_session(args.id, busy=lambda sid: False)
        return _deleted({"deleted": args.id, "events": n})

    return int(_writing(args, ctx, go))


def remote_delete(args: argparse.Namespace, r: Remote) -> int:
    with r.answers():
        row = r.session(args.id)
        if row is None:
            r.client.session(args.id)  # the server's 404, in its words
        if not _confirmed(args, row):
            return EXIT_ERROR
        return _deleted(r.client.delete(args.id))


# -- fork -----------------------------------------------------------------------------------------------


def _forked(args: argparse.Namespace, row: dict[str, Any], origin: str) -> int:
    if args.json:
        return _said(args, row, "forked")
    print(f"forked session {origin} into {row['id']} ({row['events']} events); continue it with "
          f"`workbench run --session {row['id']} \"...\"`")
    return EXIT_OK


def cmd_fork(args: argparse.Namespace, ctx: CommandContext) -> int:
    new_id = args.new_id or uuid.uuid4().hex[:12]

    def go(host: Any) -> dict[str, Any]:
        host.log.fork_session(args.id, args.seq, new_id=new_id, title=args.title)
        return host.log.session(new_id)

    return _forked(args, _writing(args, ctx, go), args.id)


def remote_fork(args: argparse.Namespace, r: Remote) -> int:
    with r.answers():
        return _forked(args, r.client.fork(args.id, args.seq, id=args.new_id, title=args.title), args.id)


# -- search ---------------------------------------------------------------------------------------------


def _print_hits(args: argparse.Namespace, page: dict[str, Any]) -> int:
    hits = page["hits"]
    if args.json:
        for h in hits:
            h.pop("running", None)
            print(json.dumps(h, ensure_ascii=False))
    elif not hits:
        print(f"no session mentions {args.text!r}", file=sys.stderr)
    else:
        print(table([(h["id"], h["updated_at"][:19], "title" if h["seq"] == 0 else f"#{h['seq']}", h["title"],
                      h["snippet"]) for h in hits], ("id", "active (UTC)", "where", "title", "found"), (14, 19, 7, 30)))
    if page["next"] is not None:
        print(f"more: the next page is `--cursor {page['next']}`", file=sys.stderr)
    return EXIT_OK


def _search_kw(args: argparse.Namespace) -> dict[str, Any]:
    return {"limit": args.limit, "cursor": args.cursor, "archived": None if args.archived else False}


def cmd_search(args: argparse.Namespace, ctx: CommandContext) -> int:
    return _print_hits(args, _reading(args, ctx, lambda h: h.log.search(args.text, **_search_kw(args))))


def remote_search(args: argparse.Namespace, r: Remote) -> int:
    with r.answers():
        return _print_hits(args, r.client.search(args.text, **_search_kw(args)))


# -- usage and models -----------------------------------------------------------------------------------


def _print_usage(args: argparse.Namespace, usage: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(usage, ensure_ascii=False))
        return EXIT_OK
    cost = (lambda t: f"${t['cost']:.4f}") if usage["priced"] else (lambda t: "-")
    rows = [(t["seq"] or "-", t["calls"], t["input_tokens"] + t["cache_read_input_tokens"] + t["cache_creation_input_tokens"],
             t["output_tokens"], cost(t)) for t in usage["turns"]]
    print(table(rows, ("turn", "calls", "tokens in", "tokens out", "cost"), (6, 6, 12, 12)))
    print(f"total: {describe(usage['total'], usage['priced'])}")
    return EXIT_OK


def cmd_usage(args: argparse.Namespace, ctx: CommandContext) -> int:
    def go(host: Any) -> dict[str, Any]:
        row = host.log.session(args.id)
        events = host.log.events(args.id, types=["session_created", "user_message", "assistant_turn"])
        return {"session_id": args.id, **session_usage(events, host.prices, row["model"])}

    return _print_usage(args, _reading(args, ctx, go))


def remote_usage(args: argparse.Namespace, r: Remote) -> int:
    with r.answers():
        return _print_usage(args, r.client.usage(args.id))


def _print_models(args: argparse.Namespace, models: list[dict[str, Any]]) -> int:
    if args.json:
        for m in models:
            print(json.dumps(m, ensure_ascii=False))
        return EXIT_OK
    print(table([(m["name"] + (" (default)" if m["default"] else ""), ", ".join(m["thinking"]) or "-",
                  ", ".join(m["efforts"]) or "-", "yes" if m["priced"] else "no") for m in models],
                ("model", "thinking", "effort", "priced"), (36, 20, 30)))
    return EXIT_OK


def cmd_models(args: argparse.Namespace, ctx: CommandContext) -> int:
    return _print_models(args, _reading(args, ctx, lambda h: h.model_choices()))


def remote_models(args: argparse.Namespace, r: Remote) -> int:
    with r.answers():
        return _print_models(args, r.client.models())


# -- arguments ------------------------------------------------------------------------------------------


def _id_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("--json", action="store_true", help="print the session's row as JSON")


def _rename_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("title", nargs="+", help="the new title (words are joined with spaces)")
    p.add_argument("--json", action="store_true", help="print the session's row as JSON")


def _delete_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("--yes", action="store_true", help="do not ask; needed when stdin is not a terminal")


def _fork_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="the session to fork")
    p.add_argument("--seq", type=argument(int), help="copy events up to this seq (cut back to a turn boundary); default: all")
    p.add_argument("--new-id", help="the new session's id (default: a fresh one)")
    p.add_argument("--title", help="the new session's title (default: the origin's)")
    p.add_argument("--json", action="store_true", help="print the new session's row as JSON")


def _search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="words to find in titles, messages, replies and tool results (any case)")
    p.add_argument("--archived", action="store_true", help="also search archived sessions")
    p.add_argument("--limit", type=argument(int), default=20, metavar="N", help="at most N sessions (1 to 100; default 20)")
    p.add_argument("--cursor", help="the page after the one that printed this cursor")
    p.add_argument("--json", action="store_true", help="one JSON object per hit")


def _json_only(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="JSON instead of a table")


def _usage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    _json_only(p)


_archive, _remote_archive = _archiver(True)
_unarchive, _remote_unarchive = _archiver(False)

MANAGE_COMMANDS = (
    Command("rename", "give a session a new title", _rename_args, cmd_rename, remote=remote_rename),
    Command("archive", "hide a session from listings (it stays searchable)", _id_json, _archive, remote=_remote_archive),
    Command("unarchive", "bring an archived session back", _id_json, _unarchive, remote=_remote_unarchive),
    Command("delete", "delete a session's events for good (asks first)", _delete_args, cmd_delete, remote=remote_delete),
    Command("fork", "a new session starting with a copy of another's log", _fork_args, cmd_fork, remote=remote_fork),
    Command("search", "find sessions by words in their titles and messages", _search_args, cmd_search,
            remote=remote_search),
    Command("usage", "a session's tokens and estimated cost, per turn", _usage_args, cmd_usage, remote=remote_usage),
    Command("models", "the models a session may be created with", _json_only, cmd_models, remote=remote_models),
)
