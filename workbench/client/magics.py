"""`%load_ext workbench`, then `%%agent` / `%agent` send text to a session of the server's brain.

    %%agent [--session ID] [--new] [--model NAME] [--title TITLE] [--with df,sales.csv]
    text for the agent, any number of lines

    %agent [options] text on one line
    %agent --session ID            (no text: make ID this notebook's session)

One default session per notebook (kernel): created on first use, kept until
`--new` or `--session`. The cell runs until the turn ends and shows it live;
interrupting the cell (the stop button) interrupts the turn in the server.
`--with a,b` copies variables of this kernel (by type: client/data.py) and files
into the session's workspace first, each recorded as a `file_attached` event,
and tells the agent in a note before the text.
"""

from __future__ import annotations

import re
import threading
from types import MappingProxyType
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class

from ..errors import WorkbenchError

OPTIONS = MappingProxyType({
    "--session": True, "--with": True, "--model": True, "--title": True, "--url": True, "--token": True,
    "--new": False, "--background": False, "--interrupt": False,
})
USAGE = (
    "usage: %%agent [--session ID] [--new] [--model NAME] [--title TITLE] [--with VAR,FILE,...] [--background] "
    "[--url URL --token TOKEN], then the text; %agent --interrupt stops the running turn"
)


TOKEN = re.compile(r"""\s*(?:"([^"]*)"|'([^']*)'|(\S+))""")


def _word(text: str) -> tuple[str, str]:
    """The first (optionally quoted) word of text, and the text after it."""
    m = TOKEN.match(text)
    if not m or m.end() == 0:
        return "", ""
    word = next(g for g in m.groups() if g is not None)
    return word, text[m.end():]


def parse(line: str) -> tuple[dict[str, Any], str]:
    """(options, rest of the line, verbatim) of a magic line; options come first."""
    opts: dict[str, Any] = {}
    rest = line.strip()
    while rest.startswith("--"):
        word, rest = _word(rest)
        name, eq, value = word.partition("=")
        if name not in OPTIONS:
            raise WorkbenchError(f"unknown option {name} ({USAGE})")
        if OPTIONS[name]:
            if not eq:
                value, rest = _word(rest)
                if not value:
                    raise WorkbenchError(f"{name} needs a value ({USAGE})")
            opts[name[2:]] = value
        else:
            opts[name[2:]] = True
        rest = rest.strip()
    return opts, rest


@magics_class
class AgentMagics(Magics):
    """The %agent and %%agent magics."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        self.client: Any = None
        self.session_id: str | None = None

    def _client(self, opts: dict[str, Any]) -> Any:
        from .api import connect

        if opts.get("url") or self.client is None:
            self.client = connect(opts.get("url"), opts.get("token"))
        return self.client

    @line_cell_magic
    def agent(self, line: str, cell: str | None = None) -> None:
        """Send text to this notebook's agent session and show the turn live."""
        try:
            opts, rest = parse(line)
            text = cell if cell is not None else rest
            client = self._client(opts)
            if opts.get("session"):
                client.session(opts["session"])  # 404 -> a clear error
                self.session_id = opts["session"]
            if opts.get("interrupt"):
                done = client.interrupt(self.session_id) if self.session_id else False
                print("agent: interrupted the running turn" if done else "agent: no turn was running")
                return
            if opts.get("new") or self.session_id is None:
                if not (text or "").strip() and not opts.get("with"):
                    if opts.get("new"):
                        self.session_id = client.create_session(title=opts.get("title"), model=opts.get("model"))["id"]
                        print(f"agent: new session {self.session_id}")
                        return
                    raise WorkbenchError(f"nothing to send ({USAGE})")
                title = opts.get("title")
                if not title and opts.get("with"):  # the message will start with the attached files' note
                    title = ((text or "").strip().splitlines() or ["Attached data"])[0][:60]
                self.session_id = client.create_session(title=title, model=opts.get("model"), first_message=text or None)["id"]
            if opts.get("with"):
                text = self._attach(client, opts["with"], text or "")
            if not (text or "").strip():
                print(f"agent: this notebook now talks to session {self.session_id}")
                return
            run_turn(client, self.session_id, text, background=bool(opts.get("background")))
        except WorkbenchError as e:
            print(f"agent: {e}")

    def _attach(self, client: Any, names: str, text: str) -> str:
        """Copy the named variables and files into the session's workspace; the text with a note for the agent
        before it (or "" when there is no text: the files are attached, no turn is started)."""
        from .data import note

        wanted = [n.strip() for n in names.split(",") if n.strip()]
        if not wanted:
            raise WorkbenchError(f"--with needs names of variables or files, comma-separated ({USAGE})")
        records = client.attach(self.session_id, *wanted, namespace=self.shell.user_ns if self.shell else {})
        for r in records:
            warning = f"; {r['warning']}" if r.get("warning") else ""
            print(f"agent: attached {r['name']} as {r['path']} ({r['bytes']:,} bytes, {r['kind']}){warning}")
        return note(records) + text if text.strip() else ""


def run_turn(client: Any, session_id: str, text: str, background: bool = False) -> Any:
    """Send text and render the turn live until it ends; Ctrl-C / the stop button interrupts it.

    With background=True the cell returns at once and a thread reads the stream and
    updates the widgets (comm messages may be sent from any thread of the kernel).
    """
    from IPython.display import display

    from .render import ChatView

    view = ChatView(session_id, prompt=text)
    handle = display(view, display_id=True)
    turn = client.turn(session_id, text)

    def follow() -> None:
        try:
            for msg in turn:
                view.feed(msg)
        except KeyboardInterrupt:
            client.interrupt(session_id)
            # the server records the interrupt; show how the turn ended
            for e in client.events(session_id, after=0)[-6:]:
                if e["type"] in ("interrupted", "turn_ended"):
                    view.event(e)
        finally:
            turn.close()
            if handle is not None:
                handle.update(view)  # the final view, with the full transcript as text/plain

    if not background:
        follow()
        return view

    def follow_logged() -> None:
        try:
            follow()
        except WorkbenchError as e:
            view.event({"type": "model_error", "payload": {"error": str(e)}})

    first = next(turn)  # open the stream and start the turn here, so errors show in this cell
    view.feed(first)
    threading.Thread(target=follow_logged, name=f"workbench-agent-{session_id}", daemon=True).start()
    return view


AGENT_LINE = re.compile(r"^([ \t]*)%agent(?:[ \t]+(.*))?$")


def agent_lines(lines: list[str]) -> list[str]:
    """A cleanup transform: each `%agent ...` line becomes its magic call with the text verbatim.

    IPython reads a line ending in `?` as a help request (`%agent what did you just do?` would show the
    help of `do`); the text of a line magic is the user's words, so it reaches %agent before that runs.
    A cell magic's body (`%%agent`, `%%bash`, ...) is left as it is.
    """
    if lines and lines[0].lstrip().startswith("%%"):
        return lines
    out = []
    for line in lines:
        end = "\n" if line.endswith("\n") else ""
        m = AGENT_LINE.match(line[: len(line) - len(end)])
        out.append(f"{m.group(1)}get_ipython().run_line_magic('agent', {(m.group(2) or '').rstrip()!r}){end}" if m else line)
    return out


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and the transform that keeps a `?` in `%agent`'s text (called by `%load_ext workbench`)."""
    ipython.register_magics(AgentMagics)
    manager = getattr(ipython, "input_transformer_manager", None)
    if manager is not None and agent_lines not in manager.cleanup_transforms:
        manager.cleanup_transforms.append(agent_lines)
