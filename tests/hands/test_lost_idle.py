"""A call whose idle status never comes ends by its execute reply, with a note; it does not wait out its timeout.

A kernel's iopub is a ZMQ PUB socket: when the reader falls behind (a flood of output on a loaded machine),
PUB drops what does not fit in the queues, silently, and the call's closing `status: idle` may be among it.
The hands then saw no loss, so they waited for an idle that would never come until the call's timeout,
interrupted a kernel that was not running anything, and replaced it: the CI run of the fidelity probes lost a
tqdm loop of 10,000 updates that way ("KernelTimeout" at 97 %). Here the kernel swallows its own idle status
(kernel code holds the kernel), and, for the real thing, the reader is held up while the kernel floods.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from workbench.hands.factory import HandsFactory, HandsSettings

TIMEOUT = 120  # the call's timeout: far beyond what the end by the reply takes (about 2 s)

SWALLOW_IDLE = """
_k = get_ipython().kernel
_publish = _k._publish_status
def _swallow(status, channel, parent=None):
    if status == "idle":  # once: this call's end
        _k._publish_status = _publish
        return None
    return _publish(status, channel, parent)
_k._publish_status = _swallow
print("printed before the end")
6 * 7
"""


def settings_for(backend: str, tmp_path, gateway=None) -> HandsSettings:
    extra = {"gateway_url": gateway.url, "gateway_token": gateway.token} if gateway else {}
    return HandsSettings(backend=backend, pool_size=0, registry_dir=str(tmp_path / "reg"), **extra)


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["local", "gateway"])
async def test_a_call_whose_idle_status_never_comes_ends_by_its_reply_with_a_note(backend, tmp_path, request):
    gateway = request.getfixturevalue("gateway") if backend == "gateway" else None
    async with HandsFactory(settings_for(backend, tmp_path, gateway)) as factory:
        h = factory("lost-idle", {"hands": {"timeout": TIMEOUT}}, None)
        first = await h.execute("'ready'")
        generation = first.generation
        started = time.monotonic()
        obs = await h.execute(SWALLOW_IDLE)
        took = time.monotonic() - started
        assert took < TIMEOUT / 2, f"the call waited {took:.0f} s for an idle status that never came"
        assert obs.ok and obs.stdout == "printed before the end\n" and obs.result == "42", obs.to_json()
        assert any("end-of-call status never arrived" in n for n in obs.truncated), obs.truncated
        # the kernel was not interrupted or replaced: its state is there, and the next call is an ordinary one
        after = await h.execute("_k is not None")
        assert after.ok and after.result == "True" and after.generation == generation, after.to_json()
        assert not after.truncated, after.truncated
        await h.shutdown()


# each line a message of its own (sys.stdout may join lines the kernel's IO thread had not sent yet into one)
FLOOD = ("_k = get_ipython().kernel\nfor i in range(30_000):\n"
         "    _k.session.send(_k.iopub_socket, 'stream', {'name': 'stdout', 'text': f'line {i}\\n'}, "
         "parent=_k.get_parent())\nprint('done')")


@pytest.mark.asyncio
async def test_a_reader_with_a_flood_waiting_lets_the_event_loop_run(tmp_path):
    """A receive with a message waiting returns without giving up the event loop, so a reader that found thousands of
    messages queued held the server's loop until it had read them all: every other session's reader starved, their
    kernels' queues filled, and ZMQ dropped their output (six tqdm loops at once: four lost their idle status). Here
    the loop is held up while the kernel floods; once it runs again, a ticker must keep running while the reader
    catches up."""
    async with HandsFactory(settings_for("local", tmp_path)) as factory:
        h = factory("flood", {"hands": {"timeout": TIMEOUT}}, None)
        await h.execute("'ready'")
        call = asyncio.ensure_future(h.execute(FLOOD))
        await asyncio.sleep(0.5)  # the call is sent and the kernel is writing
        time.sleep(8)  # the reader cannot run: the kernel's lines queue up (ZMQ, and the connection's buffers)
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.ensure_future(tick())
        obs = await asyncio.wait_for(call, TIMEOUT)
        ticker.cancel()
        assert obs.ok and obs.stdout.startswith("line 0\n"), obs.stdout[:200]
        assert gaps, "the event loop ran nothing else until the reader had read the whole flood"
        assert max(gaps) < 1.0, f"the event loop was held for {max(gaps):.2f} s by one reader"
        await h.shutdown()
