"""Without a working bubblewrap, model code is refused, out loud, unless the unsafe setting is on.

And with one: a secret that kernel code prints is masked before it reaches the log.
"""

from __future__ import annotations

import json
import logging
import subprocess

import pytest
from wbsupport import WORKBENCH, cli_env

from workbench.brain import Brain
from workbench.brain.models import ScriptedModel
from workbench.brain.models.scripted import Reply
from workbench.hands import Observation
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.hands.isolating import SandboxSettings, preflight
from workbench.render import result_blocks

from .conftest import all_gone, needs_sandbox, tree


def test_preflight_checks_a_real_sandbox():
    missing = preflight(SandboxSettings(bwrap="/nonexistent"))
    assert not missing.ok and "bubblewrap is not installed" in missing.reason
    assert "apt-get install bubblewrap" in missing.fix and "WORKBENCH_HANDS_UNSAFE_UNSANDBOXED=1" in missing.fix
    broken = preflight(SandboxSettings(bwrap="/bin/false"))  # installed, but no sandbox starts
    assert not broken.ok and "failed to start" in broken.reason


async def _turn(log, factory, code: str) -> list:
    model = ScriptedModel([Reply(code=[code]), Reply(text="done")])
    brain = Brain(log, model_factory=lambda name: model, hands_factory=factory, redact=factory.redact)
    sid = brain.create_session(model="scripted")["id"]
    procs = []
    try:
        await brain.run_turn(sid, "go")
        procs = tree((await brain.hands(sid)).status()["pid"])
    finally:
        await brain.close()
        await factory.close()
    await all_gone(procs)
    return log.events(sid)


@pytest.mark.asyncio
async def test_model_code_is_refused_without_a_sandbox(log, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WORKBENCH_BWRAP", "/nonexistent")
    with caplog.at_level(logging.WARNING, logger="workbench.hands"):
        factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=0, registry_dir=str(tmp_path / "reg")))
    assert "sandbox unavailable" in caplog.text and "model code will be refused" in caplog.text
    status = factory.status()["sandbox"]
    assert status["mode"] == "refused" and "bubblewrap is not installed" in status["reason"]
    events = await _turn(log, factory, "print('ran')")
    refused = [e.payload for e in events if e.type == "hands_refused"]
    assert len(refused) == 1 and "bubblewrap is not installed" in refused[0]["reason"] and refused[0]["fix"]
    result = next(e.payload for e in events if e.type == "tool_result")
    assert result["is_error"] and "model code was not run" in result_blocks(result)[0]["text"]
    assert "ran" not in json.dumps(result) and not [e for e in events if e.type == "hands_started"]


@pytest.mark.asyncio
async def test_the_unsafe_setting_runs_model_code_unsandboxed_and_says_so(log, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WORKBENCH_BWRAP", "/nonexistent")
    with caplog.at_level(logging.WARNING, logger="workbench.hands"):
        factory = HandsFactory(
            HandsSettings(backend="sandbox", pool_size=0, unsafe_unsandboxed=True, registry_dir=str(tmp_path / "reg"))
        )
    assert "UNSAFE: the hands are NOT sandboxed" in caplog.text
    assert factory.status()["sandbox"]["mode"] == "unsafe"
    events = await _turn(log, factory, "print('ran')")
    assert [e.payload["launcher"] for e in events if e.type == "hands_started"] == ["unsafe-local"]
    result = next(e.payload for e in events if e.type == "tool_result")
    assert not result["is_error"] and Observation.from_json(result["observation"]).stdout == "ran\n"


@pytest.mark.asyncio
async def test_the_container_setting_makes_a_secret_free_container_the_sandbox(log, tmp_path, monkeypatch, caplog):
    """Binder: no sandbox starts in the container, and the container (disposable, no secret) is the hands' sandbox."""
    monkeypatch.setenv("WORKBENCH_BWRAP", "/nonexistent")
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "WORKBENCH_VAULT"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.WARNING, logger="workbench.hands"):
        factory = HandsFactory(
            HandsSettings(backend="sandbox", pool_size=0, container_sandbox=True, registry_dir=str(tmp_path / "reg"))
        )
    assert "this container is their sandbox because WORKBENCH_HANDS_CONTAINER_SANDBOX is on" in caplog.text
    status = factory.status()["sandbox"]
    assert status["mode"] == "container" and "bubblewrap is not installed" in status["message"]
    events = await _turn(log, factory, "print('ran')")
    assert [e.payload["launcher"] for e in events if e.type == "hands_started"] == ["container"]
    result = next(e.payload for e in events if e.type == "tool_result")
    assert not result["is_error"] and Observation.from_json(result["observation"]).stdout == "ran\n"


@pytest.mark.asyncio
@pytest.mark.parametrize("held", ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "vault"])
async def test_a_container_that_holds_a_secret_is_no_sandbox(log, tmp_path, monkeypatch, caplog, held, vault_file):
    """Code beside the server could read its key (/proc/<server>/environ) or use the vault: refused, and why."""
    monkeypatch.setenv("WORKBENCH_BWRAP", "/nonexistent")
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "WORKBENCH_VAULT"):
        monkeypatch.delenv(name, raising=False)
    if held == "vault":
        monkeypatch.setenv("WORKBENCH_VAULT", str(vault_file))
    else:
        monkeypatch.setenv(held, "sk-not-a-real-key")
    with caplog.at_level(logging.WARNING, logger="workbench.hands"):
        factory = HandsFactory(
            HandsSettings(backend="sandbox", pool_size=0, container_sandbox=True, registry_dir=str(tmp_path / "reg"))
        )
    named = "the egress credential" if held == "vault" else held
    assert "model code will be refused" in caplog.text and named in caplog.text and "sk-not-a-real-key" not in caplog.text
    assert factory.status()["sandbox"]["mode"] == "refused"
    events = await _turn(log, factory, "print('ran')")
    refused = [e.payload for e in events if e.type == "hands_refused"]
    assert len(refused) == 1 and refused[0]["fix"].startswith("remove ") and named in refused[0]["fix"]
    assert not [e for e in events if e.type == "hands_started"]
    assert "sk-not-a-real-key" not in json.dumps([e.payload for e in events])


def test_the_cli_warns_on_stderr(tmp_path):
    env = cli_env(WORKBENCH_BWRAP="/nonexistent", WORKBENCH_HANDS_BACKEND="sandbox", WORKBENCH_HANDS_POOL_SIZE="0")
    p = subprocess.run(
        [*WORKBENCH, "run", "```python\nprint(2 + 3)\n```", "--db", str(tmp_path / "db.duckdb")],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert "sandbox unavailable: bubblewrap is not installed" in p.stderr
    assert "[hands_refused]" in p.stderr and "5\n" not in p.stdout


@needs_sandbox
@pytest.mark.asyncio
async def test_a_printed_secret_is_masked_in_the_log(log, tmp_path, monkeypatch, secret, vault_file, upstream):
    monkeypatch.setenv("WORKBENCH_VAULT", str(vault_file))
    work = tmp_path / "work"
    work.mkdir()
    (work / "leaked.txt").write_text(f"the key is {secret}.")  # readable by the sandbox on purpose
    (work / "leaked.txt").chmod(0o644)
    factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=0, registry_dir=str(tmp_path / "reg")))
    model = ScriptedModel([Reply(code=["print(open('leaked.txt').read())"]), Reply(text="done")])
    brain = Brain(log, model_factory=lambda name: model, hands_factory=factory, redact=factory.redact)
    sid = brain.create_session(model="scripted", config={"hands": {"workdir": str(work)}})["id"]
    procs = []
    try:
        await brain.run_turn(sid, "go")
        procs = tree((await brain.hands(sid)).status()["pid"])
    finally:
        await brain.close()
        await factory.close()
    assert len(procs) >= 3  # bwrap, its init, the kernel (and socat)
    await all_gone(procs)
    events = log.events(sid)
    assert [e.payload["launcher"] for e in events if e.type == "hands_started"] == ["sandbox"]
    result = next(e.payload for e in events if e.type == "tool_result")
    assert Observation.from_json(result["observation"]).stdout == "the key is [secret example].\n"
    assert secret not in json.dumps([e.payload for e in events])


@needs_sandbox
@pytest.mark.asyncio
async def test_a_pooled_sandbox_kernel_takes_on_its_session_egress(tmp_path, monkeypatch, upstream, vault_file, secret):
    allow = f"127.0.0.1:{upstream.port}"
    monkeypatch.setenv("WORKBENCH_VAULT", str(vault_file))
    monkeypatch.setenv("WORKBENCH_EGRESS_ALLOW_PRIVATE", allow)
    factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=1, registry_dir=str(tmp_path / "reg")))
    events: list = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    try:
        await factory.start()
        hands = factory("s1", {"egress": {"credentials": ["example"]}}, sink)
        code = f"import urllib.request; print(urllib.request.urlopen('http://{allow}/pooled').read().decode(), end='')"
        obs = await hands.execute(code)
        procs = tree(hands.status()["pid"])
    finally:
        await factory.close()
    await all_gone(procs)
    assert obs.ok and obs.stdout == "ok from upstream\n", obs.text()
    assert [p["pooled"] for t, p in events if t == "hands_started"] == [True]
    assert ("egress_allowed", {"host": "127.0.0.1", "port": upstream.port, "method": "GET", "credential": "example"}) in events
    assert [r["headers"]["Authorization"] for r in upstream.requests] == [f"Bearer {secret}"]
