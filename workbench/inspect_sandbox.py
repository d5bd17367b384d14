"""The `workbench` sandbox environment of Inspect AI: an Inspect task's tools run in workbench hands.

Registered the way Inspect's extensions are (the `inspect_ai` entry point group names this module, whose
`@sandboxenv(name="workbench")` registers the class), so `Task(..., sandbox="workbench")` or
`sandbox=("workbench", {"db": ..., "backend": ...})` picks it. Each sample gets a session of kind `inspect` in a
workbench log and that session's hands (a sandboxed kernel with its workspace, as an agent's): `exec` runs there
and each call is logged as the session's `tool_started` / `tool_result`, so `workbench show SESSION` reads the
sample's tool calls and a killed kernel is replaced, the call that it cut off answered with its death. Python
(Inspect's `python()` tool, or `python3 -` with the code as input) runs as a cell in the kernel; any other command
runs as a subprocess started from the kernel, inside its sandbox. Files are read and written in the workspace
through the workspace module (never through a link). One host per log file serves every sample of the process.

inspect_ai is an optional dependency (the `inspect` extra): nothing in the core imports this module.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal, overload

from inspect_ai.util import ExecResult, SandboxEnvironment, SandboxEnvironmentConfigType, sandboxenv
from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits
from pydantic import BaseModel, Field

from .errors import WorkbenchError
from .hands.factory import HandsSettings
from .hands.files import FileTooLarge, NoSuchFile, check_path, open_file, write_file
from .hands.isolating import WORKSPACE as KERNEL_WORKSPACE
from .host import Host

PYTHON_COMMANDS = (["python3", "-"], ["python3"], ["python", "-"], ["python"], ["bash", "--login", "-c", "python3 -"],
                   ["bash", "-c", "python3 -"], ["sh", "-c", "python3 -"])  # how Inspect's python() runs its code
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MARGIN_S = 30.0  # beyond an exec's own timeout, how long the hands wait before they interrupt the kernel
DEFAULT_TIMEOUT_S = 600.0  # an exec without a timeout


class WorkbenchSandboxConfig(BaseModel, frozen=True):
    """The sandbox's config (`sandbox=("workbench", {...})`); every field optional."""

    db: str = Field(default="", description="the workbench log file; empty: WORKBENCH_DB, else one in a new temp dir")
    backend: Literal["sandbox", "local"] = Field(default="sandbox", description="how the kernels run (docs/settings.md)")
    memory_mb: int = Field(default=4096, gt=0, description="each kernel's memory limit")
    cpu_seconds: int = Field(default=0, ge=0, description="each kernel's CPU seconds; 0: unlimited")


def _config(config: SandboxEnvironmentConfigType | None) -> WorkbenchSandboxConfig:
    if config is None:
        return WorkbenchSandboxConfig()
    if isinstance(config, WorkbenchSandboxConfig):
        return config
    if isinstance(config, str):  # a JSON file beside the task
        return WorkbenchSandboxConfig.model_validate_json(Path(config).read_text())
    if isinstance(config, BaseModel):
        return WorkbenchSandboxConfig.model_validate(config.model_dump())
    return WorkbenchSandboxConfig.model_validate(config)


def bash_cell(cmd: list[str], input: str | bytes | None, cwd: str | None, env: dict[str, str] | None,
              timeout: float) -> str:
    """A cell (one expression: nothing is left in the kernel's namespace) that runs `cmd` as a subprocess of the
    kernel, writes its stdout and stderr to the cell's streams and evaluates to its exit status."""
    data = input.encode() if isinstance(input, str) else input
    return ("(lambda _r: (__import__('sys').stdout.write(_r.stdout.decode('utf-8', 'replace')), "
            "__import__('sys').stderr.write(_r.stderr.decode('utf-8', 'replace')), _r.returncode)[-1])("
            f"__import__('subprocess').run({cmd!r}, input={data!r}, cwd={cwd!r}, "
            f"env={{**__import__('os').environ, **{dict(env or {})!r}}}, capture_output=True, timeout={timeout!r}))")


def _error_text(error: dict[str, Any]) -> str:
    """A call's error as a terminal-free traceback (IPython colours it)."""
    tb = error.get("traceback")
    if isinstance(tb, list) and tb:
        return ANSI.sub("", "\n".join(str(line) for line in tb))
    return f"{error.get('ename', 'Error')}: {error.get('evalue', '')}"


@sandboxenv(name="workbench")
class WorkbenchSandboxEnvironment(SandboxEnvironment):
    """One sample's workbench session and its hands."""

    # Inspect's lifecycle is class-level (task_init, sample_init, task_cleanup are classmethods): the hosts
    # shared by this process's samples, one per log file, with how many samples use each
    hosts: ClassVar[dict[Path, tuple[Host, int]]] = {}
    lock: ClassVar[tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None] = None
    default_db: ClassVar[Path | None] = None

    def __init__(self, host: Host, session_id: str, db: Path) -> None:
        super().__init__()
        self.host, self.session_id, self.db = host, session_id, db
        self.calls = 0

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return WorkbenchSandboxConfig.model_validate(config)

    @classmethod
    def _lock(cls) -> asyncio.Lock:
        """The lock of the hosts, made in the running loop (a second `inspect_ai.eval` in the process runs another)."""
        loop = asyncio.get_running_loop()
        if cls.lock is None or cls.lock[0] is not loop:
            cls.lock = (loop, asyncio.Lock())
        return cls.lock[1]

    @classmethod
    def _db(cls, cfg: WorkbenchSandboxConfig) -> Path:
        """The log file: the config's, else WORKBENCH_DB, else one in a temporary directory made once per process
        (so that every sample of the process is in the same log)."""
        if cfg.db:
            return Path(cfg.db).expanduser().resolve()
        if os.environ.get("WORKBENCH_DB"):
            return Path(os.environ["WORKBENCH_DB"]).expanduser().resolve()
        if cls.default_db is None:
            cls.default_db = Path(tempfile.mkdtemp(prefix="workbench-inspect-")) / "workbench.duckdb"
        return cls.default_db

    @classmethod
    async def _acquire(cls, cfg: WorkbenchSandboxConfig) -> tuple[Host, Path]:
        db = cls._db(cfg)
        async with cls._lock():
            if db in cls.hosts:
                host, n = cls.hosts[db]
                cls.hosts[db] = (host, n + 1)
                return host, db
            db.parent.mkdir(parents=True, exist_ok=True)
            host = Host.build(db, hands=HandsSettings(backend=cfg.backend, pool_size=0, memory_mb=cfg.memory_mb,
                                                      cpu_seconds=cfg.cpu_seconds))
            try:
                await host.start()
            except BaseException:
                await host.close()
                raise
            cls.hosts[db] = (host, 1)
            return host, db

    @classmethod
    async def _release(cls, db: Path) -> None:
        async with cls._lock():
            host, n = cls.hosts[db]
            if n > 1:
                cls.hosts[db] = (host, n - 1)
                return
            del cls.hosts[db]
        await host.close()

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        host, db = await cls._acquire(_config(config))
        try:
            row = host.brain.create_session(title=f"inspect: {task_name}"[:200], model="scripted", kind="inspect",
                                            config={"inspect": {"task": task_name, "metadata": {
                                                str(k)[:200]: str(v)[:2000] for k, v in list(metadata.items())[:50]}}})
            env = cls(host, row["id"], db)
            await (await host.brain.hands(env.session_id)).workspace(create=True)
        except BaseException:
            await cls._release(db)
            raise
        return {"default": env}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for environment in environments.values():
            env = environment.as_type(WorkbenchSandboxEnvironment)
            try:
                await env.host.brain.close_session(env.session_id)
            finally:
                await cls._release(env.db)

    # -- the verbs ---------------------------------------------------------------------------------------------

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        from inspect_ai.util import SandboxUserUnsupportedError

        if user is not None:
            raise SandboxUserUnsupportedError("the workbench sandbox runs every command as its kernel's user")
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise ValueError("cmd must be a non-empty list of strings")
        limit = float(timeout) if timeout else DEFAULT_TIMEOUT_S
        python = cmd in PYTHON_COMMANDS and input is not None and not cwd and not env
        tool_input: dict[str, Any]
        if python:
            code = input.decode("utf-8", "replace") if isinstance(input, bytes) else str(input)
            name, tool_input = "python", {"code": code}
        else:
            code = bash_cell(cmd, input, cwd, env, limit)
            name, tool_input = "exec", {"cmd": list(cmd), "cwd": cwd, "code": code}
        self.calls += 1
        tool_use_id = f"inspect-{self.session_id}-{self.calls}"
        log = self.host.log
        await log.aappend(self.session_id, "tool_started", {"tool_use_id": tool_use_id, "name": name, "input": tool_input})
        hands = await self.host.brain.hands(self.session_id)
        obs = await hands.execute(code, timeout=limit + (0 if python else MARGIN_S))
        await log.aappend(self.session_id, "tool_result", {"tool_use_id": tool_use_id, "name": name,
                                                             "is_error": obs.error is not None,
                                                             "observation": obs.to_json()})
        err = obs.error
        # past its timeout: the subprocess's own (TimeoutExpired), or the hands interrupted the cell (or replaced a
        # kernel that ignored the interrupt); a KeyboardInterrupt the code raised itself sooner is its own error
        late = (obs.duration_ms or 0) >= limit * 1000 * 0.99
        if err is not None and (err.get("ename") == "TimeoutExpired" and not python
                                or err.get("ename") in ("KeyboardInterrupt", "KernelTimeout") and late):
            raise TimeoutError(f"the command ran past its timeout of {limit:g} s")
        stdout, stderr = obs.stdout, obs.stderr
        if python:
            if err is not None:
                stderr = (stderr + "\n" if stderr else "") + _error_text(err) + (f"\n{obs.hint}" if obs.hint else "")
            return ExecResult(success=err is None, returncode=0 if err is None else 1, stdout=stdout, stderr=stderr)
        if err is not None:  # the kernel died or was replaced, or the subprocess could not start
            return ExecResult(success=False, returncode=126, stdout=stdout,
                              stderr=(stderr + "\n" if stderr else "") + _error_text(err))
        try:
            code_ = int((obs.result or "").strip().splitlines()[-1])
        except (ValueError, IndexError):
            code_ = 1
        return ExecResult(success=code_ == 0, returncode=code_, stdout=stdout, stderr=stderr)

    async def _root(self) -> tuple[Path, tuple[int, int] | None]:
        hands = await self.host.brain.hands(self.session_id)
        root = await hands.workspace(create=True)
        if root is None:
            raise FileNotFoundError("the sample's hands have no workspace on this machine")
        return root, hands.workspace_owner()

    def _relative(self, root: Path, file: str) -> str:
        """A path of the workspace: relative, or absolute as this machine or the sandboxed kernel (/workspace) sees it."""
        p = PurePosixPath(file)
        if p.is_absolute():
            for base in (PurePosixPath(str(root)), PurePosixPath(KERNEL_WORKSPACE)):
                if p.is_relative_to(base) and p != base:
                    p = p.relative_to(base)
                    break
            else:
                raise PermissionError(f"{file!r} is outside the sample's workspace ({KERNEL_WORKSPACE} in the sandbox)")
        try:
            return check_path(str(p))
        except WorkbenchError as e:
            raise PermissionError(str(e)) from None

    async def write_file(self, file: str, contents: str | bytes) -> None:
        root, owner = await self._root()
        path = self._relative(root, file)
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        try:
            await asyncio.to_thread(write_file, root, path, io.BytesIO(data), owner)
        except WorkbenchError as e:
            raise (IsADirectoryError if "is a directory" in str(e) else PermissionError)(str(e)) from None

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        from inspect_ai.util import OutputLimitExceededError

        root, _ = await self._root()
        path = self._relative(root, file)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE

        def read() -> bytes:
            with open_file(root, path, limit) as (fh, _size):
                return fh.read(limit + 1)

        try:
            data = await asyncio.to_thread(read)
        except FileTooLarge:
            raise OutputLimitExceededError(limit_str=f"{limit:,} bytes", truncated_output=None) from None
        except NoSuchFile as e:
            raise FileNotFoundError(str(e)) from None
        except WorkbenchError as e:
            raise (IsADirectoryError if "directory" in str(e) else PermissionError)(str(e)) from None
        return data.decode("utf-8") if text else data

    def default_polling_interval(self) -> float:
        return 0.2

    def identity(self) -> dict[str, Any]:
        """Which workbench session and log this sample's sandbox is (for a task's metadata, or a person)."""
        return json.loads(json.dumps({"session_id": self.session_id, "db": str(self.db)}))
