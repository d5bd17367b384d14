"""A warm pool: kernels started before anyone needs them.

A kernel takes about half a second to become ready; the pool keeps `size`
of them ready so that a first call, or the call after a kernel died, takes
one at once. Filling happens in background tasks, never on the path of a
model request. Any launcher can fill one; its `fits` and `adopt` decide
whether and how a session takes a pooled kernel.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..base import Kernel, Launcher


class KernelPool:
    """Keeps `size` ready kernels of one launcher; `take()` hands one out (and, with `refill`, starts another in
    its place: without, the pool is filled once, for a process that ends with its turn)."""

    def __init__(self, launcher: Launcher, size: int = 1, refill: bool = True):
        self.launcher, self.size, self.refill = launcher, size, refill
        self._ready: list[Kernel] = []
        self._starting: set[asyncio.Task] = set()
        self._closed = False
        self.failures = 0
        self.last_error: str | None = None

    def fill(self) -> None:
        """Start kernels in the background until `size` are ready or starting."""
        if self._closed:
            return
        while len(self._ready) + len(self._starting) < self.size:
            task = asyncio.get_running_loop().create_task(self._boot())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)  # also a task cancelled before it ran

    def _refill(self) -> None:
        """After a take: start what the pool lacks, unless it is filled only once."""
        if self.refill:
            self.fill()

    async def _boot(self) -> None:
        try:
            kernel = await self.launcher.start(None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a pool that cannot start kernels leaves the hands to start their own
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return
        finally:
            # no longer starting before it is ready: counted once (a done callback runs a loop iteration
            # later, and a fill() in between would count this kernel twice)
            self._starting.discard(asyncio.current_task())
        if self._closed:
            await kernel.kill()
        else:
            self._ready.append(kernel)

    async def take(self) -> Kernel | None:
        """A ready kernel, or one that is almost ready; None if the pool has none coming."""
        while True:
            while self._ready:
                kernel = self._ready.pop(0)
                if await kernel.death() is None:
                    self._refill()
                    return kernel
                await kernel.kill()  # died while waiting in the pool
            if not self._starting or self._closed:
                self._refill()
                return None
            # a kernel that is already booting is ready sooner than a new one would be
            await asyncio.wait(set(self._starting), return_when=asyncio.FIRST_COMPLETED)

    async def close(self) -> None:
        """Stop every kernel the pool holds or is starting."""
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        ready, self._ready = self._ready, []
        await asyncio.gather(*(kernel.kill() for kernel in ready), return_exceptions=True)

    def status(self) -> dict[str, Any]:
        """How many kernels are ready and starting, JSON-ready."""
        return {"size": self.size, "refill": self.refill, "ready": len(self._ready), "starting": len(self._starting),
                "failures": self.failures, "last_error": self.last_error}
