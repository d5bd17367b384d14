"""Helpers of the secrets-and-forgetting tests: a host with a vault and scripted models, chats, byte counts."""

from __future__ import annotations

import asyncio
import json

from tornado.httpclient import HTTPClientError

from workbench.brain.models import ModelCatalog, Reply, ScriptedModel
from workbench.egress import Vault
from workbench.host import Host
from workbench.memory.dream import create_dream, run_dream
from workbench.memory.dream_script import dream_script
from workbench.memory.plugin import MemoryPlugin

TOKEN = "ghp_Qk7RmX2vN9sTz4LpW8yB3cJ6hF1dG5aE0uKi"  # the shape of a GitHub token: detect-secrets knows it
VAULT_VALUE = "vlt-Zq4Xw8Rt2Yp6Nm0Kd3"  # plain enough that only the vault knows it is a secret
SYSTEMS: list[str] = []


def model_factory(name: str):
    if name == "capture":  # answers every request, remembering its system prompt
        return ScriptedModel(lambda request: (SYSTEMS.append(request["system"]), Reply(text="noted"))[1], name=name)
    if name == "echo":  # an assistant turn that repeats the secret
        return ScriptedModel(lambda request: Reply(text=f"Deploying with {TOKEN} as the memory says."), name=name)
    return ModelCatalog(scripts={"dream": dream_script}).make(name)


def make_host(db, vault: Vault | None = None) -> Host:
    vault = vault or Vault.from_dict({"credentials": {"deploy": {"value": VAULT_VALUE, "hosts": ["api.example.com:443"]}}})
    return Host.build(db, hands=False, plugins=[MemoryPlugin(vault=vault)], model_factory=model_factory)


def chat(host: Host, model: str, text: str) -> str:
    sid = host.brain.create_session(title="chat", model=model)["id"]
    assert asyncio.run(host.brain.run_turn(sid, text)) == "end_turn"
    return sid


def dream(host: Host, sessions: list[str]) -> tuple[str, dict]:
    store = host.plugin("memory").store
    dream_id = create_dream(host.brain, store, sessions=sessions, model="scripted:dream")
    return dream_id, asyncio.run(run_dream(host.brain, store, dream_id))


def copies(path, text: str) -> int:
    """How often text is in the raw bytes of the database file and its write-ahead log."""
    return sum(p.read_bytes().count(text.encode()) for p in (path, path.with_name(path.name + ".wal")) if p.exists())


def checkpoint(host: Host) -> None:
    host.log.write(lambda tx: None).result()
    host.log._writer.submit(lambda: host.log._con.execute("CHECKPOINT")).result()


async def call(jp_fetch, method, *path, body=None, params=None):
    """(status, JSON body) of a request to the workbench API; errors are answers too."""
    kw = {"method": method, "params": params}
    if body is not None:
        kw["body"] = json.dumps(body)
    try:
        r = await jp_fetch("workbench", "api", *path, **kw)
        return r.code, json.loads(r.body or b"null")
    except HTTPClientError as e:
        return e.code, json.loads(e.response.body) if e.response is not None and e.response.body else None
