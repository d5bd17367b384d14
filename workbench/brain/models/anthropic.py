"""Claude through the official `anthropic` SDK (async, streaming).

The key comes from ANTHROPIC_API_KEY and the base URL from ANTHROPIC_BASE_URL
(so Anthropic-compatible local servers, and the fake server of
`workbench.testing`, work too). The SDK's own retries are off: the brain
retries, and records each attempt in the log.

The request's `model` is the session's model as the catalog knows it
(`claude-opus-5-5`, `anthropic:NAME`); the API is sent this model's own name
(`NAME` for `anthropic:NAME`), so the log and a cassette keep the catalog's name.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from ...errors import MissingAPIKey
from .base import FatalModelError, RetryableError

DEFAULT_MODEL = "claude-opus-5-5"
RETRYABLE_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


class AnthropicModel:
    """A Model that streams from the Messages API with the official SDK."""

    def __init__(
        self,
        name: str = DEFAULT_MODEL,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 600.0,
    ):
        self.name = name
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise MissingAPIKey(
                f"model {name!r} needs ANTHROPIC_API_KEY; set it, or use --model scripted for the offline model"
            )
        base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        if base_url is not None:
            import httpx

            httpx.URL(base_url)  # a malformed one is refused when the model is made, as the SDK's client would
        self._options: dict[str, Any] = {"api_key": key, "base_url": base_url, "max_retries": 0, "timeout": timeout}
        self._client: Any = None  # the SDK's client, made at the first request

    async def stream(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        # the SDK is imported here, not when the model is made: it costs seconds of a loaded machine, which a process
        # that makes a model and sends it nothing (a resume with nothing to finish, a cassette replayed) need not pay
        import anthropic as a

        if self._client is None:
            self._client = a.AsyncAnthropic(**self._options)
        request = {**request, "model": self.name}  # `anthropic:NAME` is the catalog's name; the API knows NAME
        try:
            if request.get("betas"):  # e.g. server-side compaction: the beta endpoint takes the header
                stream = await self._client.beta.messages.create(**request, stream=True)
            else:
                stream = await self._client.messages.create(**request, stream=True)
            async for event in stream:
                yield event.to_dict(mode="json")
        except a.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            err = body.get("error", body) if isinstance(body, dict) else {}
            etype = err.get("type") if isinstance(err, dict) else None
            message = (err.get("message") if isinstance(err, dict) else None) or str(e)
            status = e.status_code
            if status in (408, 409, 429) or status >= 500 or etype in RETRYABLE_TYPES:
                after = e.response.headers.get("retry-after") if e.response is not None else None
                raise RetryableError(f"{status} {etype or ''}: {message}".strip(), status, _seconds(after)) from None
            raise FatalModelError(f"{status} {etype or ''}: {message}".strip(), status) from None
        except (a.APIConnectionError, a.APITimeoutError) as e:
            raise RetryableError(f"connection failed: {e}") from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


def list_models(timeout: float = 10.0) -> list[str] | None:
    """The model ids the key can use, from the Models API (every page); None without a key. Raises the SDK's
    errors: a server without a Models API (an Anthropic-compatible one) answers 404."""
    key = os.environ.get("ANTHROPIC_API_KEY")
    if not key:
        return None  # before the SDK's import: 1.9 s of CPU here, for every `workbench models` without a key
    import anthropic

    with anthropic.Anthropic(api_key=key, base_url=os.environ.get("ANTHROPIC_BASE_URL") or None,
                             max_retries=1, timeout=timeout) as client:
        return [m.id for m in client.models.list(limit=1000)]


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
