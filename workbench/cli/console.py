"""What every `workbench` command shares: its host, a live view of a turn, running async code, tables.

`Console` is the CommandContext that plugin commands get (workbench.plugins).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..host import Host
from ..plugins import Plugin
from ..render import one_line, result_text, table, tool_input

if TYPE_CHECKING:
    from ..hands.factory import HandsFactory, HandsSettings

EXIT_OK, EXIT_STOPPED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

NOTED = ("hands_died", "hands_timeout", "model_retry", "model_error", "hands_refused", "turn_failed")


SILENCE_NOTE = 10.0  # seconds without live output before the CLI says a call is still running


class Printer:
    """Shows a turn as it happens: text deltas and a running call's output live, tool calls and results as committed."""

    def __init__(self, session_id: str, *, out: TextIO | None = None, side: TextIO | None = None, thinking: bool = False):
        self.session_id, self.thinking = session_id, thinking
        self.out, self.side = out or sys.stdout, side or sys.stderr
        self._at_line_start = True
        self._side_line_start = True  # in a call's live output
        self._shown: dict[str, float] = {}  # calls whose output was shown live: their elapsed seconds
        self._said: dict[str, float] = {}  # per call: its elapsed seconds when its output (or a note) was last printed

    def output(self, session_id: str, m: dict[str, Any]) -> None:
        """A running call's live output (brain/live.py): its lines as `│ ...`, what was skipped, a note in long silences."""
        if session_id != self.session_id:
            return
        text, elapsed = m.get("text") or "", float(m.get("elapsed_s") or 0)
        parts = []
        if m.get("skipped"):
            parts.append(("" if self._side_line_start else "\n") + f"│ [… {m['skipped']:,} characters not shown live …]\n")
            self._side_line_start = True
        if text:
            lines = text.split("\n")
            body = "\n│ ".join(lines)
            parts.append(("│ " if self._side_line_start else "") + (body[:-2] if text.endswith("\n") else body))
            self._side_line_start = text.endswith("\n")
        elif m.get("state") == "running" and elapsed - self._said.get(m["tool_use_id"], 0.0) >= SILENCE_NOTE:
            nl = "" if self._side_line_start else "\n"
            parts.append(f"{nl}│ [running: {m.get('elapsed_s', 0):.0f} s, hands {m.get('hands')}]\n")
            self._side_line_start = True
        if parts:
            if m["tool_use_id"] not in self._shown:
                parts.insert(0, "├─ output (live) ─\n")
            self._said[m["tool_use_id"]] = elapsed
            self._shown[m["tool_use_id"]] = float(m.get("elapsed_s") or 0)
            self._write(self.side, "".join(parts))
        if m.get("state") == "done" and m["tool_use_id"] in self._shown:
            self._shown[m["tool_use_id"]] = float(m.get("elapsed_s") or 0)
            if not self._side_line_start:
                self._write(self.side, "\n")
                self._side_line_start = True

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
            mark = "✗" if p.get("is_error") else "└"
            elapsed = self._shown.pop(p.get("tool_use_id"), None)
            if elapsed is None:
                lines = result_text(p).splitlines()[:40]
                self._write(self.side, "".join(f"│ {line}\n" for line in lines) + f"{mark}──────────────\n\n")
            else:  # its output was shown as it came: only what ends it
                obs = p.get("observation") or {}
                tail = result_text(p).splitlines()[-10:] if p.get("is_error") else []
                notes = [str(n) for n in obs.get("truncated") or []] if isinstance(obs, dict) else []
                self._write(self.side, "".join(f"│ {line}\n" for line in tail + notes) + f"{mark}── {elapsed:.1f} s ──────\n\n")
        elif ev.type in NOTED:
            self._write(self.side, f"[{ev.type}] {one_line(str(p), 300)}\n")


class Console:
    """The CommandContext of the `workbench` command: hosts, live views and async runs for its commands."""

    def __init__(self, plugins: Sequence[Plugin]):
        self.plugins = list(plugins)

    def build_host(self, args: argparse.Namespace, *, read_only: bool = False,
                   hands: HandsFactory | HandsSettings | bool = True) -> Host:
        """A Host for the command's --db with this command's plugins, built but not started."""
        return Host.build(getattr(args, "db", None), read_only=read_only, hands=hands, plugins=self.plugins)

    def open_host(self, args: argparse.Namespace, *, read_only: bool = False,
                  hands: HandsFactory | HandsSettings | bool = True) -> Any:
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
        unlisten_output = host.brain.listen_output(printer.output)

        def on_event(ev: Any) -> None:
            if extra is not None:
                extra(ev)
            printer.event(ev)

        unsubscribe = host.log.subscribe(on_event)

        def stop() -> None:
            unlisten()
            unlisten_output()
            unsubscribe()

        return stop


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_STOPPED", "Console", "Printer", "table"]
