"""What every `workbench` command shares: its host, a live view of a turn, running async code, tables.

`Console` is the CommandContext that plugin commands get (workbench.plugins).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO

from ..host import Host
from ..plugins import Plugin
from ..render import one_line, result_text, table, tool_input

EXIT_OK, EXIT_STOPPED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

NOTED = ("hands_died", "hands_timeout", "model_retry", "model_error", "hands_refused", "turn_failed")


class Printer:
    """Shows a turn as it happens: text deltas live, tool calls and results as committed."""

    def __init__(self, session_id: str, *, out: TextIO | None = None, side: TextIO | None = None, thinking: bool = False):
        self.session_id, self.thinking = session_id, thinking
        self.out, self.side = out or sys.stdout, side or sys.stderr
        self._at_line_start = True

    def _write(self, stream: TextIO, text: str) -> None:
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
            code = tool_input("python", p["input"])
            self._write(self.side, "\n┌─ python ─────\n" + "".join(f"│ {line}\n" for line in code.splitlines()))
        elif ev.type == "tool_started":
            self._write(self.side, f"\n┌─ {p['name']} {tool_input(p['name'], p['input'])[:200]}\n")
        elif ev.type == "tool_result":
            lines = result_text(p).splitlines()[:40]
            mark = "✗" if p.get("is_error") else "└"
            self._write(self.side, "".join(f"│ {line}\n" for line in lines) + f"{mark}──────────────\n\n")
        elif ev.type in NOTED:
            self._write(self.side, f"[{ev.type}] {one_line(str(p), 300)}\n")


class Console:
    """The CommandContext of the `workbench` command: hosts, live views and async runs for its commands."""

    def __init__(self, plugins: Sequence[Plugin]):
        self.plugins = list(plugins)

    def build_host(self, args: argparse.Namespace, *, read_only: bool = False, hands: Any = True) -> Host:
        """A Host for the command's --db with this command's plugins, built but not started."""
        return Host.build(getattr(args, "db", None), read_only=read_only, hands=hands, plugins=self.plugins)

    def open_host(self, args: argparse.Namespace, *, read_only: bool = False, hands: Any = True) -> Any:
        """A Host for the command's --db, started, closed when the block ends (an async context manager)."""
        return Host.open(getattr(args, "db", None), read_only=read_only, hands=hands, plugins=self.plugins)

    def run(self, coro_fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run a coroutine; SIGTERM interrupts it like Ctrl-C (KeyboardInterrupt), so kernels are stopped."""

        async def main() -> Any:
            task = asyncio.current_task()
            assert task is not None, "asyncio.run runs main() as a task"
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
            return await coro_fn()

        try:
            return asyncio.run(main())
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None

    def follow(self, host: Host, session_id: str, *, thinking: bool = False, side: TextIO | None = None,
               extra: Callable[[Any], None] | None = None) -> Callable[[], None]:
        """Print a session's turn as it happens; returns a function that stops printing."""
        printer = Printer(session_id, thinking=thinking, side=side)
        unlisten = host.brain.listen(printer.delta)

        def on_event(ev: Any) -> None:
            if extra is not None:
                extra(ev)
            printer.event(ev)

        unsubscribe = host.log.subscribe(on_event)

        def stop() -> None:
            unlisten()
            unsubscribe()

        return stop


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_STOPPED", "Console", "Printer", "table"]
