"""Model names through the official SDK, against the fake Messages API: what the API is sent as `model`,
and the fake API's scripts per model (two models of one eval answer differently; an unknown one is a 404)."""

from __future__ import annotations

import asyncio

import pytest

from workbench.brain.models import FatalModelError, MessageBuilder, ModelCatalog, Reply
from workbench.testing import FakeMessagesAPI


def ask(name: str, text: str = "hi") -> dict:
    """One model call by catalog name, with the request the brain would build (its `model` is the catalog name)."""
    model = ModelCatalog().make(name)
    request = {"model": name, "max_tokens": 64, "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}

    async def go() -> dict:
        builder = MessageBuilder()
        try:
            async for ev in model.stream(request):
                builder.feed(ev)
            return builder.result()
        finally:
            await model.aclose()
    return asyncio.run(go())


def test_an_anthropic_prefixed_name_sends_the_name_after_the_prefix(api):
    api.use(lambda req: Reply(text=f"I am {req['model']}"))
    assert ask("anthropic:local-model-7b")["content"][0]["text"] == "I am local-model-7b"
    assert api.requests[-1]["model"] == "local-model-7b"
    # a name with a colon of its own keeps it: only the prefix is the catalog's
    assert ask("anthropic:org/model:v2")["content"][0]["text"] == "I am org/model:v2"
    # claude-... names are sent as they are
    assert ask("claude-haiku-5-5")["content"][0]["text"] == "I am claude-haiku-5-5"
    assert [r["model"] for r in api.requests] == ["local-model-7b", "org/model:v2", "claude-haiku-5-5"]


def test_the_fake_api_answers_each_model_from_its_own_script(api):
    api.use({"claude-opus-5-5": lambda req: Reply(text="careful"), "claude-haiku-5-5": [Reply(text="hasty")],
             "local": "default"})
    assert ask("claude-opus-5-5")["content"][0]["text"] == "careful"
    assert ask("claude-haiku-5-5")["content"][0]["text"] == "hasty"
    assert "scripted model" in ask("anthropic:local")["content"][-1]["text"]
    # a model the scripts do not name: the real API's 404, not retried, the model named
    for name, sent in (("claude-opus-4-5", "claude-opus-4-5"), ("anthropic:claude-opus-5-5x", "claude-opus-5-5x"),
                       ("anthropic:" + "x" * 5000, "x" * 200)):
        with pytest.raises(FatalModelError) as e:
            ask(name)
        assert e.value.status == 404 and f"not_found_error: model: {sent}" in str(e.value)
    assert len(api.rejections) == 3
    # one script for every model again
    api.use([Reply(text="any")])
    assert ask("claude-opus-4-5")["content"][0]["text"] == "any"


def test_a_script_per_model_is_checked_when_given():
    api = FakeMessagesAPI()
    for bad in ({}, {"": "default"}, {1: "default"}):
        with pytest.raises(ValueError, match="model names"):
            api.use(bad)
    with pytest.raises(TypeError, match="a script is"):
        api.use({"claude-opus-5-5": 42})
    with pytest.raises(KeyError):
        api.use({"claude-opus-5-5": "no-such-script"})


def test_a_model_that_is_not_a_string_is_a_404_not_a_crash(api):
    import httpx

    api.use({"claude-opus-5-5": "default"})
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for model in (["claude-opus-5-5"], {"a": 1}, None, 7):
        r = httpx.post(f"{api.url}/v1/messages", json={**body, "model": model}, headers={"x-api-key": "k"}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_with_a_key_the_catalog_offers_the_models_it_can_use_and_refuses_others_by_name(api):
    """The Models API, through the SDK (issue 25, item 7): listed once and kept; an unknown name is refused
    before anything is written, with the names that exist; the picker offers them."""
    from workbench.errors import UnknownModel
    from workbench.host import Host, HostSettings
    from workbench.log import MemoryLog

    api.use({"claude-opus-5-5": "default", "claude-haiku-5-5": "default", "local-7b": "default"})
    catalog = ModelCatalog()
    assert catalog.available() == ("claude-haiku-5-5", "claude-opus-5-5", "anthropic:local-7b")
    catalog.check("claude-haiku-5-5")
    catalog.check("anthropic:local-7b")
    catalog.check("scripted")  # not the API's: never refused for its list
    for wrong in ("claude-opus-5", "anthropic:local-8b"):
        with pytest.raises(UnknownModel) as e:
            catalog.check(wrong)
        assert str(e.value) == (f"model {wrong!r} does not exist for this key; it can use: "
                                "claude-haiku-5-5, claude-opus-5-5, anthropic:local-7b")
    assert api.model_lists == 1, "the list is asked for once and kept"
    # the model picker (GET /models, `workbench models`) offers them after the configured ones
    host = Host.build(settings=HostSettings(), hands=False, plugins=[], log=MemoryLog())
    try:
        offered = [m["name"] for m in host.model_choices()]
    finally:
        asyncio.run(host.close())
    assert offered == ["claude-opus-5-5", "scripted", "claude-haiku-5-5", "anthropic:local-7b"], offered


def test_without_a_models_api_names_are_not_checked(api):
    """An Anthropic-compatible server with no Models API (the fake one answering any model): nothing is refused."""
    api.use("default")
    catalog = ModelCatalog()
    assert catalog.available() is None
    catalog.check("claude-opus-5")
    assert api.model_lists == 0


def test_a_malformed_base_url_is_refused_when_the_model_is_made(monkeypatch):
    """The SDK's client is made at the first request, but a base URL it would refuse still fails the model's making
    (so a session is not created for a model that cannot be asked), with the reason."""
    from workbench.checks import check_model
    from workbench.errors import ConfigError
    from workbench.host import Host, HostSettings
    from workbench.log import MemoryLog

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    for bad in ("http://[::1", "http://\x01/"):
        monkeypatch.setenv("ANTHROPIC_BASE_URL", bad)
        host = Host.build(settings=HostSettings(), hands=False, plugins=[], log=MemoryLog())
        try:
            for name in ("claude-opus-5-5", "anthropic:local"):
                with pytest.raises(ConfigError, match=f"cannot make model '{name}' \\(InvalidURL\\)"):
                    check_model(host, name)
        finally:
            asyncio.run(host.close())
