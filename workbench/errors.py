"""Exceptions of the workbench.

    WorkbenchError                 anything the workbench raises on purpose
     ├── ConfigError               a setting, CLI argument or request body is invalid
     │    ├── BodyTooLarge         a request body over its route's limit (413)
     │    ├── KeyReused            an idempotency key sent again with a different message (422)
     │    └── VaultUnsafe          the credential vault is readable by other users
     ├── LogError                  the session log cannot do what was asked
     │    ├── DatabaseLocked       another process holds the DuckDB file
     │    ├── DatabaseUnreadable   the file is not a DuckDB database we can open
     │    ├── DatabaseMissing      a read-only command named a file that does not exist
     │    ├── UnknownSession       no session with that id
     │    ├── SessionExists        a session with that id already exists
     │    ├── UnknownEventType     an event type that docs/events.md does not document
     │    ├── InvalidPayload       a payload or session field is not strict JSON, or too big
     │    ├── QueryRefused         a SQL query is not one read-only SELECT, or broke a limit
     │    └── LogClosed            the log was closed
     ├── ModelError                choosing or calling a model failed
     │    ├── UnknownModel         no model of that name
     │    ├── MissingAPIKey        an Anthropic model without ANTHROPIC_API_KEY
     │    ├── ModelCallFailed      the model call failed after its retries
     │    └── CassetteError        a cassette file is missing, corrupt, cut off or not UTF-8
     │         └── CassetteMiss    a replayed request the cassette does not hold (brain/models/cassette.py;
     │                             also a FatalModelError, so the brain records it as a model_error)
     ├── TurnBusy                  a turn is already running in that session
     ├── ServerStopping            the workbench server is stopping (a request then gets a 503)
     ├── ServerUnavailable         no workbench server answers the notebook client
     ├── RequestRefused            the workbench server answered a client request with an error
     ├── PluginError               a plugin could not be loaded or contributes something invalid
     └── MemoryStoreError          the memory store cannot do what was asked
          ├── UnknownMemory        no memory with that id
          ├── MemoryConflict       the review action does not fit the memory's status
          └── SharedStoreReadOnly  a write to a store this server mounts read-only from its maintainer's file

Hands failures (a dead kernel, a timeout, a traceback) are not exceptions:
they are observations for the model. Every message here is one line a person
can act on. `http_status` is how the server answers a request that raised it
(one mapping, read by every handler).
"""


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""

    http_status = 400


class ConfigError(WorkbenchError):
    """A setting, CLI argument or request body is invalid."""


class BodyTooLarge(ConfigError):
    """A request body over the route's limit."""

    http_status = 413


class KeyReused(ConfigError):
    """A message's idempotency key was sent before with a different message."""

    http_status = 422


class VaultUnsafe(ConfigError):
    """The credential vault file is readable by users other than the server's."""


class LogError(WorkbenchError):
    """The session log cannot do what was asked."""


class DatabaseLocked(LogError):
    """Another process holds the DuckDB file (DuckDB allows one writing process)."""

    http_status = 503
    holder_pid: int | None = None  # the process holding the file, when DuckDB says


class DatabaseUnreadable(LogError):
    """The file exists but is not a DuckDB database we can open."""

    http_status = 503


class DatabaseMissing(LogError):
    """A read-only command named a database file that does not exist."""


class UnknownSession(LogError):
    """No session with that id."""

    http_status = 404


class SessionExists(LogError):
    """A session with that id already exists."""

    http_status = 409


class UnknownEventType(LogError):
    """An event type that is not documented in docs/events.md."""


class InvalidPayload(LogError):
    """A payload or session field the log will not store: not strict JSON, or over a limit."""


class QueryRefused(LogError):
    """A SQL query that is not exactly one SELECT, failed, or broke a query limit."""


class LogClosed(LogError):
    """The session log was closed; nothing more can be read or written through it."""

    http_status = 503


class ModelError(WorkbenchError):
    """Choosing or calling a model failed."""


class UnknownModel(ModelError):
    """No model of that name."""


class MissingAPIKey(ModelError):
    """An Anthropic model was asked for but ANTHROPIC_API_KEY is not set."""


class ModelCallFailed(ModelError):
    """The model call failed after all retries."""


class CassetteError(ModelError):
    """A cassette file of recorded model calls cannot be read or written."""


class TurnBusy(WorkbenchError):
    """A turn is already running in that session."""

    http_status = 409


class ServerStopping(WorkbenchError):
    """The server is stopping: a request arriving now, or failing under the shutdown, gets a 503."""

    http_status = 503


class ServerUnavailable(WorkbenchError):
    """No Jupyter server with the workbench extension answers the client."""


class RequestRefused(WorkbenchError):
    """The workbench server answered a client request with an error (its status and message).

    `as_local()` is the error the server raised for it, with the same words: what the in-process
    transport of the service raises for the same call (`unknown`: the error of a 404 there).
    """

    def __init__(self, status: int, message: str, unknown: type[WorkbenchError] | None = None):
        super().__init__(f"{message} (HTTP {status})")
        self.status = status
        self.message = message
        self.unknown = unknown or UnknownSession

    def as_local(self) -> WorkbenchError:
        """The error this refusal stands for (404: `unknown`; 409: a conflict, an existing session or a busy turn;
        422: a reused idempotency key)."""
        if self.status == 404:
            return self.unknown(self.message)
        if self.status == 409:
            if issubclass(self.unknown, MemoryStoreError):
                return MemoryConflict(self.message)
            return SessionExists(self.message) if "exists" in self.message else TurnBusy(self.message)
        if self.status == 400:
            return ConfigError(self.message)
        if self.status == 422:
            return KeyReused(self.message)
        return self


class PluginError(WorkbenchError):
    """A plugin could not be loaded, or it contributes something invalid (a clash of names, a bad hook)."""


class MemoryStoreError(WorkbenchError):
    """The memory store cannot do what was asked."""


class UnknownMemory(MemoryStoreError):
    """No memory with that id."""

    http_status = 404


class MemoryConflict(MemoryStoreError):
    """A review action that does not fit the memory's current status."""

    http_status = 409


class SharedStoreReadOnly(MemoryStoreError):
    """A write to a shared store: this server mounts it read-only from the file its maintainer publishes."""

    http_status = 403
