"""How a plugin's own operations join the service: an interface, an in-process implementation and a REST one.

    ServicePart(kind=MemoryOps, local=lambda plugin: LocalMemory(plugin), rest=lambda calls: RestMemory(calls))

`Workbench.part("memory", MemoryOps)` builds the one of its transport: in-process over the plugin (bound to
the host), or over the server's API through `RestCalls`, the narrow HTTP a plugin's REST part may use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..errors import PluginError, UnknownSession, WorkbenchError

if TYPE_CHECKING:
    from .base import Workbench

T = TypeVar("T")


class RestCalls(Protocol):
    """What a plugin's REST part may do: call routes of the server's API (its own, documented in docs/api.md)."""

    url: str  # the Jupyter server's URL
    workbench: Workbench  # the core operations over the same server (a session's stream, its row)

    async def call(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
                   content: bytes | None = None, unknown: type[WorkbenchError] = UnknownSession) -> Any:
        """The JSON answer of `method path` (path under /workbench/api, its parts quoted by the caller);
        a refusal is RequestRefused whose `as_local()` is `unknown` for a 404."""
        ...


@dataclass(frozen=True)
class ServicePart(Generic[T]):
    """A plugin's operations: `kind` is their interface, `local` builds them over the plugin (bound to a host),
    `rest` over the REST API of a server that runs the plugin."""

    kind: type[T]
    local: Callable[[Any], T]
    rest: Callable[[RestCalls], T]


def checked(name: str, made: object, kind: type[T]) -> T:
    """`made` as a `kind` (an explicit, checked downcast); PluginError when it is not one."""
    if not isinstance(made, kind):
        raise PluginError(f"the {name!r} plugin's operations are a {type(made).__name__}, not a {kind.__name__}")
    return made


def no_part(name: str, loaded: list[str]) -> PluginError:
    """The error of asking for the operations of a plugin that is not loaded or adds none."""
    if name not in loaded:
        return PluginError(f"the {name!r} plugin is not loaded here (loaded: {', '.join(loaded) or 'none'})")
    return PluginError(f"the {name!r} plugin adds no operations to the service")


__all__ = ["RestCalls", "ServicePart", "checked", "no_part"]
