"""The fidelity suite's fixtures: the brain against the fake Messages API, with real (sandboxed) hands."""

from __future__ import annotations

import pytest
import pytest_asyncio

from workbench.brain import Brain, BrainSettings


@pytest.fixture
def api(fake_api, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.url)
    return fake_api


@pytest_asyncio.fixture
async def brain(log, hands):
    b = Brain(log, hands_factory=hands, settings=BrainSettings(retry_base=0.01))
    yield b
    await b.close()
