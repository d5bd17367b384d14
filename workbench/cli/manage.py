"""Commands that manage sessions: rename, archive, unarchive, delete, fork, search, usage, models.

Each runs on the database itself or, when a workbench server holds it, through the server's REST
API (cli/remote.py) with the same output and the same errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..errors import InvalidPayload
from ..plugins import Command
from ..render import one_line, table
from ..strictnum import argument
from ..usage import describe
from .console import EXIT_ERROR, EXIT_OK
from .service import Service, on_service


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


def rename_cmd(args: argparse.Namespace, wb: Service) -> int:
    title = _title(args)
    return _said(args, wb.run(lambda s: s.rename(args.id, title)), "renamed")


def _archiver(archived: bool) -> Callable[[argparse.Namespace, Service], int]:
    word = "archived" if archived else "unarchived"

    def archive(args: argparse.Namespace, wb: Service) -> int:
        return _said(args, wb.run(lambda s: s.archive(args.id, archived)), word)

    return archive


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


def delete_cmd(args: argparse.Namespace, wb: Service) -> int:
    row = wb.run(lambda s: s.session(args.id))  # UnknownSession first
    if not _confirmed(args, row):
        return EXIT_ERROR
    return _deleted(wb.run(lambda s: s.delete(args.id)))


# -- fork -----------------------------------------------------------------------------------------------


def _forked(args: argparse.Namespace, row: dict[str, Any], origin: str) -> int:
    if args.json:
        return _said(args, row, "forked")
    print(f"forked session {origin} into {row['id']} ({row['events']} events); continue it with "
          f"`workbench run --session {row['id']} \"...\"`")
    return EXIT_OK


def fork_cmd(args: argparse.Namespace, wb: Service) -> int:
    return _forked(args, wb.run(lambda s: s.fork(args.id, args.seq, new_id=args.new_id, title=args.title)), args.id)


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


def search_cmd(args: argparse.Namespace, wb: Service) -> int:
    return _print_hits(args, wb.run(lambda s: s.search(args.text, **_search_kw(args))))


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


def usage_cmd(args: argparse.Namespace, wb: Service) -> int:
    return _print_usage(args, wb.run(lambda s: s.usage(args.id)))


def _print_models(args: argparse.Namespace, models: list[dict[str, Any]]) -> int:
    if args.json:
        for m in models:
            print(json.dumps(m, ensure_ascii=False))
        return EXIT_OK
    print(table([(m["name"] + (" (default)" if m["default"] else ""), ", ".join(m["thinking"]) or "-",
                  ", ".join(m["efforts"]) or "-", "yes" if m["priced"] else "no") for m in models],
                ("model", "thinking", "effort", "priced"), (36, 20, 30)))
    return EXIT_OK


def models_cmd(args: argparse.Namespace, wb: Service) -> int:
    return _print_models(args, wb.run(lambda s: s.models())["models"])


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


MANAGE_COMMANDS = (
    Command("rename", "give a session a new title", _rename_args, **on_service(rename_cmd)),
    Command("archive", "hide a session from listings (it stays searchable)", _id_json, **on_service(_archiver(True))),
    Command("unarchive", "bring an archived session back", _id_json, **on_service(_archiver(False))),
    Command("delete", "delete a session's events for good (asks first)", _delete_args, **on_service(delete_cmd)),
    Command("fork", "a new session starting with a copy of another's log", _fork_args, **on_service(fork_cmd)),
    Command("search", "find sessions by words in their titles and messages", _search_args,
            **on_service(search_cmd, read_only=True)),
    Command("usage", "a session's tokens and estimated cost, per turn", _usage_args, **on_service(usage_cmd, read_only=True)),
    Command("models", "the models a session may be created with", _json_only, **on_service(models_cmd, read_only=True)),
)
