"""The memory tool's commands: Anthropic's client-side `memory_20250818`, over the memory stores a session mounts.

Claude models are trained to keep notes under `/memories` with this tool (`view`, `create`, `str_replace`,
`insert`, `delete`, `rename`). Here `/memories` is a view of the session's mounts (memfiles.py): reads are
the accepted memories (and the session's own writes waiting for review); every write is a version attributed
to the session (`agent:<session id>`), citing the call's `tool_started` event, and is a proposal a person
reviews unless the store's policy accepts the tool's writes at once (`tool_accept_stores`). The SDK's
`BetaAbstractMemoryTool` dispatches the commands, and its command types are what the input is checked against.

Each write is planned from a read of the store, checked (path rules, mounts, sizes, the secret guard) outside
the log's writer, then committed in one transaction that first checks nothing it read has changed; when
something did (another session's write to the same memory), it is planned again from the new state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from anthropic.lib.tools import BetaAbstractMemoryTool
from anthropic.lib.tools._beta_functions import ToolError
from anthropic.types.beta import (
    BetaMemoryTool20250818CreateCommand,
    BetaMemoryTool20250818DeleteCommand,
    BetaMemoryTool20250818InsertCommand,
    BetaMemoryTool20250818RenameCommand,
    BetaMemoryTool20250818StrReplaceCommand,
    BetaMemoryTool20250818ViewCommand,
)
from pydantic import Field, TypeAdapter, ValidationError

from ..plugins.errors import WorkbenchError
from ..plugins.tools import ToolContext, ToolOutput
from .memfiles import MAX_LISTED, File, PathRefused, Where, children, human_size, is_dir, numbered, parse_path, session_files
from .mounts import Mount, of_session, stores_of
from .store import MAX_TEXT_CHARS, MemoryStore

RETRIES = 8  # plans of one write, when other writes keep changing what it read
COMMANDS: TypeAdapter[Any] = TypeAdapter(Annotated[  # the SDK's command types, told apart by `command`
    BetaMemoryTool20250818ViewCommand | BetaMemoryTool20250818CreateCommand | BetaMemoryTool20250818StrReplaceCommand
    | BetaMemoryTool20250818InsertCommand | BetaMemoryTool20250818DeleteCommand | BetaMemoryTool20250818RenameCommand,
    Field(discriminator="command")])


class _Stale(Exception):
    """What a write was planned from changed before its transaction: plan it again."""


@dataclass(frozen=True)
class Change:
    """One planned write: the file it changes (None: a new one), to what, and the path the citation quotes."""

    where: Where
    file: File | None
    title: str | None = None
    text: str | None = None
    delete: bool = False


def _text(value: str, what: str) -> str:
    """A file's text as a memory holds it; ToolError says what is wrong with it."""
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ToolError(f"{what} holds a NUL character or a lone surrogate (not UTF-8 text); write plain text")
    if not value.strip():
        raise ToolError(f"{what} is empty; a memory file holds some text (delete a file you no longer need)")
    if len(value.strip()) > MAX_TEXT_CHARS:
        raise ToolError(f"{what} is {len(value.strip()):,} characters; a memory file holds at most {MAX_TEXT_CHARS:,}: "
                        "split it into several files")
    return value.strip()


class SessionMemory(BetaAbstractMemoryTool):
    """One call of the memory tool by one session, over the stores it mounts."""

    def __init__(self, store: MemoryStore, ctx: ToolContext | None = None):
        super().__init__()
        self.store = store
        self.ctx = ctx
        self.written: list[dict[str, Any]] = []  # what the call wrote: memory id, version, status, store, action
        if ctx is not None:
            self.actor = f"agent:{ctx.session_id}"
            self.mounts: tuple[Mount, ...] = of_session(ctx.log, ctx.session_id, store.shared)

    # -- reading -----------------------------------------------------------------------

    def _files(self) -> dict[tuple[str, str], File]:
        stores = stores_of(self.mounts)
        return session_files(self.store.list(store=stores, annotate=False), self.actor, stores)

    def _where(self, path: Any) -> Where:
        try:
            where = parse_path(path)
        except PathRefused as e:
            raise ToolError(str(e)) from None
        if where.store is not None and where.store not in stores_of(self.mounts):
            raise ToolError(f"there is no /memories/{where.store}: this session mounts {self._mounted()}")
        return where

    def _mounted(self) -> str:
        return ", ".join(f"/memories/{m.store} ({m.access.replace('_', '-')})" for m in self.mounts)

    def _file(self, files: dict[tuple[str, str], File], where: Where) -> File:
        f = files.get((where.store or "", where.name))
        if f is None:
            what = "is a directory; name a file in it" if is_dir(files, where, stores_of(self.mounts)) else "does not exist"
            raise ToolError(f"The path {where.path} {what}. View /memories to see what there is.")
        return f

    def _writable(self, where: Where, files: dict[tuple[str, str], File]) -> None:
        if where.store is None or not where.name:
            raise ToolError(f"{where.path} is a directory of stores; files live in a store: "
                            f"/memories/<store>/<name>, where this session mounts {self._mounted()}")
        mount = next(m for m in self.mounts if m.store == where.store)
        if not mount.writable:
            writable = [m.store for m in self.mounts if m.writable]
            raise ToolError(f"store {where.store!r} is mounted read-only in this session: its files can be viewed, "
                            "not changed" + (f"; write under /memories/{writable[0]}/ instead" if writable else ""))

    # -- the commands (the SDK's execute dispatches to these) ---------------------------

    def view(self, command: BetaMemoryTool20250818ViewCommand) -> str:
        where, files = self._where(command.path), self._files()
        stores = stores_of(self.mounts)
        f = files.get((where.store or "", where.name))
        if f is not None:
            try:
                return numbered(f.path, f.memory["text"], command.view_range)
            except PathRefused as e:
                raise ToolError(str(e)) from None
        if not is_dir(files, where, stores):
            self._file(files, where)
        found = children(files, where, stores)
        lines = [f"{human_size(sum(f.size for f in files.values() if f.path.startswith(where.path + '/')))}\t{where.path}"]
        lines += [f"{human_size(size)}\t{path}" for path, size, _ in found[:MAX_LISTED]]
        if len(found) > MAX_LISTED:
            lines.append(f"({len(found) - MAX_LISTED} more not shown: view a directory further down)")
        notes = [f"{m.store} is mounted read-only: view its files, do not change them" for m in self.mounts
                 if not m.writable and where.store in (None, m.store)]
        pending = [f.path for f in files.values() if f.pending and f.path.startswith(where.path + "/")]
        if pending:
            notes.append("your writes waiting for a person's review (other sessions do not see them yet): "
                         + ", ".join(pending[:20]) + (f" and {len(pending) - 20} more" if len(pending) > 20 else ""))
        return (f"Here're the files and directories up to 2 levels deep in {where.path}, excluding hidden items:\n"
                + "\n".join(lines) + "".join(f"\n\nNote: {n}" for n in notes))

    def create(self, command: BetaMemoryTool20250818CreateCommand) -> str:
        where = self._where(command.path)
        text = _text(command.file_text, "file_text")
        self._refuse_secrets(command.path, where.name, text)

        def plan(files: dict[tuple[str, str], File]) -> Change:
            self._writable(where, files)
            if (where.store, where.name) in files or is_dir(files, where, stores_of(self.mounts)):
                raise ToolError(f"File {where.path} already exists; change it with str_replace or insert, or delete it first")
            parts = where.name.split("/")
            for i in range(1, len(parts)):
                if (where.store, "/".join(parts[:i])) in files:
                    raise ToolError(f"/memories/{where.store}/{'/'.join(parts[:i])} is a file, not a directory")
            return Change(where, None, where.name, text)

        return self._done(self._write(plan), f"File created successfully at: {where.path}")

    def str_replace(self, command: BetaMemoryTool20250818StrReplaceCommand) -> str:
        where = self._where(command.path)
        shown: list[str] = []

        def plan(files: dict[tuple[str, str], File]) -> Change:
            f = self._file(files, where)
            self._writable(where, files)
            old = f.memory["text"]
            count = old.count(command.old_str) if command.old_str else 0
            if count != 1:
                lines = [old[:i].count("\n") + 1 for i in _find_all(old, command.old_str)] if command.old_str else []
                raise ToolError(f"No replacement was performed, old_str `{command.old_str[:200]}` did not appear verbatim in "
                                f"{where.path}." if not lines else
                                f"No replacement was performed. Multiple occurrences of old_str `{command.old_str[:200]}` in "
                                f"lines: {', '.join(map(str, lines[:20]))}. Please ensure it is unique")
            text = _text(old.replace(command.old_str, command.new_str), "the edited file")
            self._refuse_secrets(where.path, None, text, added=command.new_str, before=old)
            line = old[:old.find(command.old_str)].count("\n") + 1
            shown[:] = [numbered(where.path, text, [max(1, line - 2), min(len(text.split("\n")), line + 2)]).split("\n", 1)[1]]
            return Change(where, f, f.memory["title"], text)

        written = self._write(plan)
        return self._done(written, "The memory file has been edited. Here is the snippet showing the change "
                                   f"(with line numbers):\n{shown[0]}")

    def insert(self, command: BetaMemoryTool20250818InsertCommand) -> str:
        where = self._where(command.path)

        def plan(files: dict[tuple[str, str], File]) -> Change:
            f = self._file(files, where)
            self._writable(where, files)
            lines = f.memory["text"].split("\n")
            if not 0 <= command.insert_line <= len(lines):
                raise ToolError(f"Invalid `insert_line` parameter: {command.insert_line}. It should be within the range "
                                f"[0, {len(lines)}].")
            lines.insert(command.insert_line, command.insert_text.rstrip("\n"))
            text = _text("\n".join(lines), "the edited file")
            self._refuse_secrets(where.path, None, text, added=command.insert_text, before=f.memory["text"])
            return Change(where, f, f.memory["title"], text)

        return self._done(self._write(plan), f"The file {where.path} has been edited.")

    def delete(self, command: BetaMemoryTool20250818DeleteCommand) -> str:
        where = self._where(command.path)

        def plan(files: dict[tuple[str, str], File]) -> Change:
            if where.store is not None and where.name and is_dir(files, where, stores_of(self.mounts)) \
                    and (where.store, where.name) not in files:
                inside = [f.path for (s, n), f in files.items() if s == where.store and n.startswith(where.name + "/")]
                raise ToolError(f"{where.path} is a directory of {len(inside)} files; delete each file "
                                f"({', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''})")
            self._writable(where, files)
            return Change(where, self._file(files, where), delete=True)

        return self._done(self._write(plan), f"Successfully deleted {where.path}")

    def rename(self, command: BetaMemoryTool20250818RenameCommand) -> str:
        old, new = self._where(command.old_path), self._where(command.new_path)
        if new.store != old.store:
            raise ToolError(f"{old.path} and {new.path} are in different stores; a memory stays in its store: create the "
                            "file in the other store and delete this one")
        self._refuse_secrets(new.path, new.name, None)

        def plan(files: dict[tuple[str, str], File]) -> Change:
            f = self._file(files, old)
            self._writable(old, files)
            if (new.store, new.name) in files or is_dir(files, new, stores_of(self.mounts)):
                raise ToolError(f"The destination {new.path} already exists")
            return Change(old, f, new.name, f.memory["text"])

        return self._done(self._write(plan), f"Successfully renamed {old.path} to {new.path}")

    # -- writing -----------------------------------------------------------------------

    def _refuse_secrets(self, path: str, name: str | None, text: str | None, *, added: str | None = None,
                        before: str | None = None) -> None:
        """ToolError when a name or text the call writes holds a credential (one the text held already is not new)."""
        problems = self.store.scanner.problems_of([(w, v) for w, v in (("name", name), ("text", text if added is None else added)) if v])
        if not problems and added is not None and text is not None:
            old = set(self.store.scanner.problems(before or "", "text"))
            problems = [p for p in self.store.scanner.problems(text, "text") if p not in old]
        if problems:
            raise ToolError(f"not saved: {'; '.join(problems)} in {path}. A memory must not hold a credential: "
                            "write where it is kept instead, never its value")

    def _write(self, plan: Callable[[dict[tuple[str, str], File]], Change]) -> list[dict[str, Any]]:
        """Plan the write from the files as they are, commit it if nothing it read changed meanwhile, else again."""
        for _ in range(RETRIES):
            change = plan(self._files())
            cite = self._cite(change.where.path)
            try:
                return self.store.log.write(functools.partial(self._commit, change=change, cite=cite)).result()
            except _Stale:
                continue
        raise ToolError(f"other writes changed {change.where.path} {RETRIES} times while this call ran; view it and try again")

    def _cite(self, quote: str) -> dict[str, Any]:
        """The citation of this call: its session, the seq of its `tool_started` event, and the path it names."""
        assert self.ctx is not None, "a call has a context"
        last = self.ctx.log.session(self.ctx.session_id)["last_seq"]
        for after in (max(0, last - 64), 0):  # the call's start was logged just before it ran: look near the end first
            for e in reversed(self.ctx.log.events(self.ctx.session_id, after, types=["tool_started"])):
                if e.payload.get("tool_use_id") == self.ctx.tool_use_id:
                    return {"session_id": self.ctx.session_id, "seq": e.seq, "quote": quote}
        raise LookupError(f"no tool_started event for call {self.ctx.tool_use_id!r} of session {self.ctx.session_id}")

    def _commit(self, tx: Any, change: Change, cite: dict[str, Any]) -> list[dict[str, Any]]:
        """The change, in the writer's transaction: what it wrote; _Stale when what it was planned from changed."""
        where, f = change.where, change.file
        assert where.store is not None, "a write names a store"
        accept = self.store.settings.accepts_tool_writes(where.store)
        status = "accepted" if accept else "proposed"
        note = f"memory tool: {'delete' if change.delete else 'create' if f is None else 'write'} {where.path}"
        if f is None:
            taken = tx.execute(  # the name is the session's, or an accepted memory's it has not replaced
                "SELECT count(*) FROM memories WHERE store = ? AND title = ? AND (status = 'accepted' AND id NOT IN "
                "(SELECT unnest(targets) FROM memories WHERE status = 'proposed' AND created_by = ?) OR "
                "(status = 'proposed' AND created_by = ? AND proposal <> 'retire'))",
                [where.store, where.name, self.actor, self.actor]).fetchone()
            if taken[0]:
                raise _Stale
            mid = self.store.tx_create(tx, title=where.name, text=change.text or "", actor=self.actor, provenance=[cite],
                                       status=status, store=where.store, note=note)
            return [self._record(tx, mid)]
        m = self.store.tx_current(tx, f.memory["id"])
        if (m["version"], m["status"]) != (f.memory["version"], f.memory["status"]):
            raise _Stale
        if f.pending or accept:  # the session's own proposal, or a store that takes its writes at once: a new version
            if not change.delete:
                self.store.tx_change(tx, m, self.actor, "edit", note=note, title=change.title, text=change.text,
                                     provenance=[*m["provenance"], cite])
                return [self._record(tx, m["id"])]
            self.store.tx_change(tx, m, self.actor, "retire", status="retired", note=note, provenance=[*m["provenance"], cite])
            out = [self._record(tx, m["id"])]
            if f.pending and m["proposal"] == "edit" and m["targets"]:  # the memory its withdrawn edit stood in for goes too
                target = self.store.tx_current(tx, m["targets"][0])
                if target["status"] == "accepted":
                    out += self._commit(tx, Change(where, File(where.store, where.name, target), delete=True), cite)
            return out
        # an accepted memory of a store whose tool writes are proposals: the session's own proposal over it
        kind = "retire" if change.delete else "edit"
        mid = self.store.tx_create(
            tx, title=m["title"] if change.delete else change.title or m["title"],
            text=f"deleted with the memory tool by session {self.ctx.session_id if self.ctx else ''}" if change.delete
            else change.text or m["text"], tags=m["tags"], actor=self.actor, provenance=[cite], status="proposed",
            proposal=kind, targets=[m["id"]], store=where.store, note=note)
        return [self._record(tx, mid)]

    def _record(self, tx: Any, memory_id: str) -> dict[str, Any]:
        m = self.store.tx_current(tx, memory_id)
        return {"id": m["id"], "version": m["version"], "status": m["status"], "store": m["store"], "proposal": m["proposal"]}

    def _done(self, written: list[dict[str, Any]], message: str) -> str:
        """The result the model reads: the SDK's words for the command, then what became of the memory (no id: the
        same call reads the same, so a cassette replays it; `memory_writes` of the result names the versions)."""
        self.written = written
        first = written[0]
        if any(w["status"] == "proposed" for w in written):
            how = "a proposal: a person reviews it before other sessions see it; you see it here meanwhile"
        elif first["status"] == "accepted":
            how = f"accepted: in effect for the sessions that mount {first['store']}"
        else:
            how = "retired: it is no longer in effect; its history is kept"
        return f"{message}\n({how})"


def _find_all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i != -1:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def _problem(e: ValidationError) -> str:
    """A validation error as one line: the command and field, and what is wrong."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        return "command must be one of view, create, str_replace, insert, delete, rename"
    return f"{where}: {err['msg']}" if where else err["msg"]


def call(store: MemoryStore, inp: Any, ctx: ToolContext) -> ToolOutput:
    """Run one memory-tool call of a session (blocking: DuckDB reads and writes)."""
    try:
        command = COMMANDS.validate_python(inp, strict=True)
    except ValidationError as e:
        return ToolOutput([{"type": "text", "text": f"not done: {_problem(e)}"}], is_error=True)
    memory = SessionMemory(store, ctx)
    try:
        text = memory.execute(command)
    except ToolError as e:
        return ToolOutput([{"type": "text", "text": str(e)}], is_error=True)
    except WorkbenchError as e:  # a value the store refused: data for the model
        return ToolOutput([{"type": "text", "text": str(e)}], is_error=True)
    return ToolOutput([{"type": "text", "text": str(text)}], details={"memory_writes": memory.written} if memory.written else {})
