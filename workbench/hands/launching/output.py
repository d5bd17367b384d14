"""What a kernel process writes to its own stdout and stderr (file descriptors 1 and 2).

A kernel inherits nothing of its host: its stdout and stderr are pipes that the hands
read, always (a pipe nobody drains would block the kernel once 64 KiB are in it), and of
which they keep a bounded tail per stream. Most output travels as Jupyter messages; this
is what does not: ipykernel's own log (why a kernel failed to start) and whatever writes
to the descriptors directly. `written` counts every byte ever received, so a reader can
ask for what came after a point it saw before (`since`). ipykernel echoes here all it reads
of fds 1 and 2, the mark with which the kernel waits for that reading at each call's end
too (DRAIN_MARK): the mark is taken out and not counted.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from typing import IO, Any

from ..observing.kernel_cap import DRAIN_MARK

STREAMS = ("stdout", "stderr")
MARK = DRAIN_MARK.encode()
CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")  # escape sequences first, then single controls


class OutputTail:
    """The last `limit` bytes of each of a kernel process's two output streams."""

    def __init__(self, limit: int = 64 * 1024):
        self.limit = limit
        self.kept: dict[str, bytearray] = {name: bytearray() for name in STREAMS}
        self.written: dict[str, int] = dict.fromkeys(STREAMS, 0)
        self._transports: list[tuple[str, asyncio.ReadTransport]] = []

    def add(self, name: str, data: bytes) -> None:
        """Take bytes the process wrote to stream `name`, keeping only the last `limit`."""
        buf = self.kept[name]
        buf += data[-self.limit :]
        written = len(data)
        if MARK[:1] in data:  # a mark, or the rest of one that began in the last read
            start = max(0, len(buf) - len(data) - len(MARK))
            marks = buf.count(MARK, start)
            if marks:
                buf[start:] = buf[start:].replace(MARK, b"")
                written -= marks * len(MARK)
        del buf[: max(0, len(buf) - self.limit)]
        self.written[name] += written

    def text(self, name: str = "stderr") -> str:
        """The kept tail of a stream, decoded (bytes that are not UTF-8 become U+FFFD)."""
        return bytes(self.kept[name]).decode("utf-8", "replace")

    def since(self, name: str, offset: int) -> str:
        """What came after `offset` (a value of `written[name]` seen before), as far as it is still kept."""
        buf = self.kept[name]
        start = max(0, len(buf) - (self.written[name] - offset))
        return bytes(buf[start:]).decode("utf-8", "replace")

    def last_line(self, width: int = 300) -> str:
        """The last line that says something (stderr first), on one line and without control characters."""
        for name in ("stderr", "stdout"):
            for line in reversed(self.text(name).splitlines()):
                line = CONTROL.sub("", line).strip()
                if line:
                    return line if len(line) <= width else line[: width - 1] + "…"
        return ""

    async def attach(self, pipes: dict[str, IO[bytes]]) -> None:
        """Read these pipes (by stream name) on the running event loop until they close."""
        loop = asyncio.get_running_loop()
        for name, pipe in pipes.items():
            transport, _ = await loop.connect_read_pipe(functools.partial(_Reader, self, name), pipe)
            self._transports.append((name, transport))

    def close(self) -> None:
        """Take what is still buffered in the pipes, then close them."""
        for name, transport in self._transports:
            pipe: Any = transport.get_extra_info("pipe")
            try:
                while pipe is not None and (data := os.read(pipe.fileno(), 65536)):
                    self.add(name, data)
            except (BlockingIOError, OSError, ValueError):
                pass
            transport.close()
        self._transports = []


class _Reader(asyncio.Protocol):
    def __init__(self, tail: OutputTail, name: str):
        self.tail, self.name = tail, name

    def data_received(self, data: bytes) -> None:
        self.tail.add(self.name, data)
