"""A session chooses the environment its hands run on (`config.hands.python`: an installed kernelspec's name or a
Python's path); its sandbox binds that environment read-only, its `ModuleNotFoundError` hint names it, and a name
that is not installed is a clear error naming the ones that are (issue 25, item 1).

Here rather than in tests/sandbox: building the second environment needs the package index, which the suite's
second, unprivileged run of the sandbox tests cannot reach."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.brain import Brain
from workbench.brain.models import ScriptedModel
from workbench.brain.models.scripted import Reply
from workbench.errors import ConfigError
from workbench.hands import Observation
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.hands.isolating import preflight
from workbench.hands.launching.pythons import session_python

_CHECK = preflight()
needs_sandbox = pytest.mark.skipif(not _CHECK.ok, reason=f"no working bubblewrap here: {_CHECK.reason}")

pytestmark = pytest.mark.slow

PROBE = "import sys\nprint(sys.executable)\nimport pandas"


@pytest.fixture(scope="module")
def other_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A second environment with ipykernel and nothing of the data stack, installed as the kernelspec `lean`:
    (its Python, the Jupyter data dir that holds the kernelspec)."""
    root = tmp_path_factory.mktemp("envs")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not installed beside this Python: scripts/test.sh installs it (pip install uv)")
    venv = root / "lean"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), "ipykernel"], check=True, timeout=600)
    data = root / "jupyter"
    subprocess.run([str(python), "-m", "ipykernel", "install", "--prefix", str(data), "--name", "lean",
                    "--display-name", "Lean (no pandas)"], check=True, capture_output=True, timeout=120)
    return python, data / "share" / "jupyter"


async def _turn(log, factory, config: dict, raises: type[Exception] | None = None) -> list:
    model = ScriptedModel([Reply(code=[PROBE]), Reply(text="done")])
    brain = Brain(log, model_factory=lambda name: model, hands_factory=factory)
    sid = brain.create_session(model="scripted", config=config)["id"]
    try:
        if raises is None:
            await brain.run_turn(sid, "go")
        else:
            with pytest.raises(raises):
                await brain.run_turn(sid, "go")
    finally:
        await brain.close()
        await factory.close()
    return log.events(sid)


@pytest.mark.parametrize("backend", [pytest.param("sandbox", marks=needs_sandbox), "local"])
@pytest.mark.asyncio
async def test_a_session_runs_on_the_environment_it_names(log, tmp_path, monkeypatch, other_env, backend):
    python, data = other_env
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    assert session_python("lean") == str(python)
    # a warm pool of the host's Python: it cannot serve a session of another environment
    factory = HandsFactory(HandsSettings(backend=backend, pool_size=1, registry_dir=str(tmp_path / "reg")))
    events = await _turn(log, factory, {"hands": {"python": "lean"}})
    (started,) = [e.payload for e in events if e.type == "hands_started"]
    assert started["python"] == str(python) and started["pooled"] is False, started
    obs = Observation.from_json(next(e.payload for e in events if e.type == "tool_result")["observation"])
    assert obs.stdout.strip() == str(python), obs.stdout  # bound at the same path, read-only
    assert obs.error is not None and obs.error["ename"] == "ModuleNotFoundError"
    assert str(python) in obs.hint and "pip install pandas" in obs.hint, obs.hint  # the hint names the session's


@pytest.mark.asyncio
async def test_the_host_environment_by_default_and_by_path(log, tmp_path, other_env):
    python, _ = other_env
    factory = HandsFactory(HandsSettings(backend="local", pool_size=0, registry_dir=str(tmp_path / "reg")))
    events = await _turn(log, factory, {"hands": {"python": str(python)}})
    obs = Observation.from_json(next(e.payload for e in events if e.type == "tool_result")["observation"])
    assert obs.stdout.strip() == str(python)
    factory = HandsFactory(HandsSettings(backend="local", pool_size=0, registry_dir=str(tmp_path / "reg2")))
    events = await _turn(log, factory, {})
    (started,) = [e.payload for e in events if e.type == "hands_started"]
    assert "python" not in started
    obs = Observation.from_json(next(e.payload for e in events if e.type == "tool_result")["observation"])
    assert obs.stdout.strip() == sys.executable and obs.error is None  # pandas is the host's


@pytest.mark.parametrize("name, says", [
    ("no-such-env", "no Jupyter kernelspec is named 'no-such-env'; installed: "),
    ("/nonexistent/bin/python", "is not an executable file"),
    ("../../etc/passwd", "no Jupyter kernelspec is named"),
    ("x" * 5000, "no Jupyter kernelspec is named"),
])
def test_a_name_that_is_not_installed_is_a_clear_error(name, says, monkeypatch, other_env):
    monkeypatch.setenv("JUPYTER_PATH", str(other_env[1]))
    with pytest.raises(ConfigError) as e:
        session_python(name)
    assert says in str(e.value) and len(str(e.value)) < 600, str(e.value)
    if "installed: " in says:
        assert "lean" in str(e.value)


@pytest.mark.asyncio
async def test_a_session_naming_a_missing_environment_gets_an_error_not_a_crash(log, tmp_path):
    factory = HandsFactory(HandsSettings(backend="local", pool_size=0, registry_dir=str(tmp_path / "reg")))
    events = await _turn(log, factory, {"hands": {"python": "no-such-env"}}, raises=ConfigError)
    (failed,) = [e.payload for e in events if e.type == "turn_failed"]  # as any invalid hands setting: said, recorded
    assert "no Jupyter kernelspec is named 'no-such-env'" in failed["error"], failed
    assert events[-1].type == "turn_ended" and not [e for e in events if e.type == "hands_started"]
