"""The scripted model: deterministic answers whose cost does not grow with the session."""

from __future__ import annotations

import asyncio

from workbench.brain.models import MessageBuilder, Reply, ScriptedModel


def request(n: int, last: str) -> dict:
    early = [{"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": f"m{i}"}]}
             for i in range(n - 1)]
    return {"model": "scripted", "system": "s", "messages": [*early, {"role": "user", "content": [{"type": "text", "text": last}]}]}


def answer(req: dict) -> dict:
    model = ScriptedModel(lambda r: Reply(thinking="", code=["print(1)"]))

    async def run() -> dict:
        builder = MessageBuilder()
        async for ev in model.stream(req):
            builder.feed(ev)
        return builder.result()

    return asyncio.run(run())


def test_the_scripted_model_reads_only_the_latest_messages_and_its_ids_differ_between_steps():
    long = request(5000, "go")
    # what came long before is not read again: an object no JSON encoder takes, early in the history, is never met
    long["messages"][3]["content"].append({"type": "text", "text": object()})
    a = answer(long)
    assert a == answer(long)  # the same request, the same answer
    b = answer(request(5002, "go"))
    assert a["id"] != b["id"] and a["content"][-1]["id"] != b["content"][-1]["id"]
    assert answer(request(3, "go"))["id"] != answer(request(3, "other"))["id"]
    assert 0 < a["usage"]["input_tokens"]
