"""A warm pool: kernels started before anyone needs them.

A kernel takes about half a second to become ready; the pool keeps `size`
of them ready so that a first call, or the call after a kernel died, takes
one at once. Filling happens in background tasks, never on the path of a
model request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .live import LiveKernel, boot, kernel_env
from .limits import Limits


class KernelPool:
    """Keeps `size` ready kernels of one launcher; `take()` hands one out."""

    def __init__(self, launcher: Any, size: int = 1, *, limits: Limits | None = None, registry: Any = None,
                 startup_timeout: float = 60.0):
        self.launcher, self.size = launcher, size
        self.limits, self.registry, self.startup_timeout = limits, registry, startup_timeout
        self._ready: list[LiveKernel] = []
        self._starting: set[asyncio.Task] = set()
        self._closed = False
        self.failures = 0
        self.last_error: str | None = None

    def fits(self, launcher: Any) -> bool:
        """Whether a kernel of this pool can serve hands with `launcher`.

        Only launchers that say `poolable = True` qualify: a launcher holding
        per-session resources (a sandbox's egress proxy) cannot share kernels.
        """
        return getattr(launcher, "poolable", False) and type(launcher) is type(self.launcher)

    def fill(self) -> None:
        """Start kernels in the background until `size` are ready or starting."""
        if self._closed:
            return
        while len(self._ready) + len(self._starting) < self.size:
            task = asyncio.get_running_loop().create_task(self._boot())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _boot(self) -> None:
        try:
            lk = await boot(self.launcher, env=kernel_env(), limits=self.limits, registry=self.registry,
                            startup_timeout=self.startup_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a pool that cannot start kernels leaves the hands to start their own
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return
        if self._closed:
            await lk.kill()
        else:
            self._ready.append(lk)

    async def take(self) -> LiveKernel | None:
        """A ready kernel, or one that is almost ready; None if the pool has none coming."""
        while True:
            while self._ready:
                lk = self._ready.pop(0)
                if await lk.poll() is None:
                    self.fill()
                    return lk
                await lk.kill()  # died while waiting in the pool
            if not self._starting or self._closed:
                self.fill()
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
        await asyncio.gather(*(lk.kill() for lk in ready), return_exceptions=True)

    def status(self) -> dict[str, Any]:
        """How many kernels are ready and starting, JSON-ready."""
        return {"size": self.size, "ready": len(self._ready), "starting": len(self._starting),
                "failures": self.failures, "last_error": self.last_error}
