"""The service from synchronous code (the CLI, a notebook): async once, sync derived.

The service runs on an event loop in a thread of its own, opened there and closed there; a face
calls `run(lambda wb: wb.sessions())` and waits. In a notebook this keeps the service off the
kernel's own loop; in the CLI the main thread stays free for the terminal (a prompt, Ctrl-C).

Ctrl-C (KeyboardInterrupt in the waiting thread) cancels the operation and waits for it to end
before it is raised again: an operation interrupted this way has recorded what it interrupted
(a turn says `interrupted`), and the face then says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")
SIGNAL_STEP = 0.1  # seconds between looks for a signal while the main thread waits for an operation


class Blocking(Generic[S]):
    """A service opened by `opener` on a loop in a thread of its own, called from other threads."""

    def __init__(self, opener: Callable[[], AbstractAsyncContextManager[S]], *,
                 errors: Callable[[BaseException], BaseException] | None = None):
        self._opener = opener
        self._errors = errors  # what an operation's error becomes for this face (the CLI: the local error)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._service: S | None = None
        self._opened = threading.Event()
        self._failed: BaseException | None = None

    # -- lifetime ------------------------------------------------------------------------------

    def open(self) -> Blocking[S]:
        """Start the loop's thread and open the service there; the opener's error, raised here."""
        self._thread = threading.Thread(target=self._main, name="workbench-service", daemon=True)
        self._thread.start()
        self._opened.wait()
        if self._failed is not None:
            self._thread.join()
            raise self._failed
        return self

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            async with self._opener() as service:
                self._service = service
                self._opened.set()
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 (opening or closing: raised in the thread that waits for it)
            self._failed = e
            self._opened.set()

    def close(self) -> None:
        """Close the service (on its loop) and end the thread; the closing's error, raised here; safe twice."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is None or stop is None or thread is None or not thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):  # the loop ended already
            loop.call_soon_threadsafe(stop.set)
        thread.join()
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def __enter__(self) -> Blocking[S]:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calling -------------------------------------------------------------------------------

    @property
    def service(self) -> S:
        """The service itself (to be used on its loop only: pass it to `run`)."""
        assert self._service is not None, "open() the service first"
        return self._service

    def run(self, fn: Callable[[S], Awaitable[T]]) -> T:
        """fn(service) on the service's loop; its result. KeyboardInterrupt cancels it and waits for its end."""
        loop = self._loop
        assert loop is not None and self._service is not None, "open() the service first"
        service = self._service

        async def call() -> T:
            return await fn(service)

        made: asyncio.Future[asyncio.Task[T]] | Any = asyncio.run_coroutine_threadsafe(_task(call), loop)
        task: asyncio.Task[T] = made.result()
        done = threading.Event()
        loop.call_soon_threadsafe(lambda: task.add_done_callback(lambda _: done.set()))
        try:
            _wait(done)
        except KeyboardInterrupt:
            loop.call_soon_threadsafe(task.cancel)
            _wait(done)
            raise
        if task.cancelled():
            raise KeyboardInterrupt
        error = task.exception()
        if error is not None:
            raise (self._errors(error) if self._errors is not None else error) from None
        return task.result()

    def iterate(self, aiter: AsyncIterator[T]) -> Iterator[T]:
        """An async iterator of the service's (a stream) as an iterator, each step run on the service's loop."""
        while True:
            try:
                yield self.run(lambda _: aiter.__anext__())
            except StopAsyncIteration:
                return

    @contextlib.contextmanager
    def entered(self, cm: AbstractAsyncContextManager[T]) -> Iterator[T]:
        """An async context manager of the service's (a stream), entered and left on the service's loop."""
        value = self.run(lambda _: cm.__aenter__())
        try:
            yield value
        except BaseException as e:
            error = e
            if not self.run(lambda _: cm.__aexit__(type(error), error, error.__traceback__)):
                raise
        else:
            self.run(lambda _: cm.__aexit__(None, None, None))


def _wait(event: threading.Event) -> None:
    """Wait for `event` in short steps: Python runs a signal's handler (Ctrl-C, the CLI's SIGTERM) only in the main
    thread and only between steps, and a signal the kernel delivers to another of the process's threads (the
    service's loop, the log's writer) does not wake a wait without a timeout: the command would never hear it."""
    while not event.wait(SIGNAL_STEP):
        pass


async def _task(make: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
    """The operation as a task of the service's loop (so that another thread can wait for it, and cancel it)."""

    async def go() -> T:
        return await make()

    return asyncio.get_running_loop().create_task(go())


__all__ = ["Blocking"]
