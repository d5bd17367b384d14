"""`workbench files`, `workbench get` and `workbench put`: a session's workspace, through the running
server's file routes (docs/api.md, "Files"). Like `close-hands`, they take no --db: a session's
workspace lives where its kernels run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from typing import Any

from ..errors import WorkbenchError
from ..plugins import Command, CommandContext
from ..strictnum import argument
from .console import EXIT_OK


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the Jupyter server's URL (default: $WORKBENCH_URL, else the one running server)")
    p.add_argument("--token", help="its token (default: the found server's, or $WORKBENCH_TOKEN / $JUPYTER_TOKEN with --url)")


def _client(args: argparse.Namespace) -> Any:
    from ..client.api import connect

    return connect(args.url, args.token)


def cmd_files(args: argparse.Namespace, ctx: CommandContext) -> int:
    client = _client(args)
    try:
        files = client.files(args.id)
    finally:
        client.close()
    if args.json:
        for f in files:
            print(json.dumps(f, ensure_ascii=False))
        return EXIT_OK
    if not files:
        print(f"session {args.id} has no files in its workspace (yet)")
    for f in files:
        when = datetime.fromtimestamp(f["mtime"]).strftime("%Y-%m-%d %H:%M")
        size = "" if f["bytes"] is None else f"{f['bytes']:,}"
        kind = {"dir": "/", "link": " -> (a link, not followed)"}.get(f["type"], "")
        print(f"{size:>14}  {when}  {f['path']}{kind}")
    return EXIT_OK


def cmd_get(args: argparse.Namespace, ctx: CommandContext) -> int:
    client = _client(args)
    try:
        data = client.get(args.id, args.path, max_bytes=args.max_bytes)
    finally:
        client.close()
    if args.output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return EXIT_OK
    out = args.output or os.path.basename(args.path)
    if os.path.exists(out) and not args.force:
        raise WorkbenchError(f"{out} exists; pass --force to replace it, or -o another name")
    with open(out, "wb") as fh:
        fh.write(data)
    print(f"wrote {out} ({len(data):,} bytes)")
    return EXIT_OK


def cmd_put(args: argparse.Namespace, ctx: CommandContext) -> int:
    path = args.path or os.path.basename(os.path.normpath(args.file))
    try:
        fh = open(args.file, "rb")  # noqa: SIM115 (closed below)
    except OSError as e:
        raise WorkbenchError(f"cannot read {args.file}: {e.strerror or e}") from None
    client = _client(args)
    try:
        rec = client.put_file(args.id, path, fh, name=os.path.basename(args.file), kind="file")
    finally:
        fh.close()
        client.close()
    if args.json:
        print(json.dumps(rec, ensure_ascii=False))
    else:
        print(f"attached {args.file} as {rec['path']} ({rec['bytes']:,} bytes, sha256 {rec['sha256'][:12]}…, event #{rec['seq']})")
    return EXIT_OK


def _files_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    _server_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object per entry")


def _get_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("path", help="the file's path in the workspace")
    p.add_argument("-o", "--output", help="where to write it (default: its name, here; - for stdout)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--max-bytes", type=argument(int), help="refuse a file bigger than this")
    _server_args(p)


def _put_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="session id")
    p.add_argument("file", help="a file on this machine")
    p.add_argument("--path", help="where it goes in the workspace (default: its name)")
    p.add_argument("--json", action="store_true", help="print the file_attached record as JSON")
    _server_args(p)


FILE_COMMANDS = (
    Command("files", "list a session's workspace in the running workbench server", _files_args, cmd_files, needs_db=False),
    Command("get", "fetch a file of a session's workspace", _get_args, cmd_get, needs_db=False),
    Command("put", "copy a file into a session's workspace (a file_attached event)", _put_args, cmd_put, needs_db=False),
)
