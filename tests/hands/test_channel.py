"""A send on a kernel channel must not leave a receive already waiting on the same socket asleep.

jupyter_client's Session.send writes through a blocking twin of the asyncio socket. That send takes in
the socket's pending notifications (ZMQ's FD is edge-triggered), so when a reply had arrived but the
event loop had not yet looked, the waiting poll is never told: it sleeps until its timeout with the
reply there. nbclient met it on every Output widget (it sends the widget's state on the shell channel
while it waits there for the execute reply): 120 s per cell in the fidelity probes.

The scenario is built step by step on real sockets, with no timing in it: the reply is known to have
arrived (its notification is on the FD) before the send, and the send is known to have taken the
notification. Without the fix (jupyter_client's AsyncZMQSocketChannel) the waiting receive, which has no
timeout, never ends: the test fails after WAIT.
"""

from __future__ import annotations

import asyncio
import select
import time

import pytest
import zmq
import zmq.asyncio
from jupyter_client.session import Session

from bench.fidelity import ReferenceKernelManager
from workbench.hands.launching.channel import HandsKernelClient, WakingChannel

WAIT = 60.0  # seconds the woken receive may take on a loaded machine; without the fix it never ends


def readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


async def send_while_a_reply_waits(channel_class: type) -> dict:
    """A receive waits on the channel; a reply arrives; the channel sends before the loop looks; the reply, read."""
    ctx = zmq.asyncio.Context()
    kernel = ctx.socket(zmq.ROUTER)
    client = ctx.socket(zmq.DEALER)
    try:
        kernel.linger = client.linger = 0
        port = kernel.bind_to_random_port("tcp://127.0.0.1")
        client.connect(f"tcp://127.0.0.1:{port}")
        session = Session(key=b"secret")
        channel = channel_class(client, session)
        channel.send(session.msg("kernel_info_request"))
        ident = (await asyncio.wait_for(kernel.recv_multipart(), WAIT))[0]

        waiting = asyncio.create_task(channel.get_msg(timeout=None))
        await asyncio.sleep(0)  # the receive is waiting now: nothing has come yet
        assert not waiting.done()
        session.send(zmq.Socket.shadow(kernel.underlying), "kernel_info_reply", {"status": "ok"}, ident=ident)
        # the reply's notification is on the client's FD, and the event loop has not run since
        fd = client.getsockopt(zmq.FD)
        assert readable(fd, WAIT), "the reply never arrived"
        # the channel sends (an Output widget's state, say) before the loop looks: the send takes the notification.
        # ZMQ's send looks at its notifications at most once a millisecond or so (by the CPU's tick counter), so
        # a send right after the last look may leave them: send again, a tick later, until one took them
        for _ in range(1000):
            channel.send(session.msg("comm_msg", {"comm_id": "w", "data": {"method": "update"}}))
            if not readable(fd):
                break
            time.sleep(0.001)
        assert not readable(fd), "the sends did not take in the notification: the scenario did not happen"
        return await asyncio.wait_for(waiting, WAIT)
    finally:
        client.close(linger=0)
        kernel.close(linger=0)
        ctx.term()


def kernel_clients() -> list[tuple[str, type]]:
    hands = HandsKernelClient()
    reference = ReferenceKernelManager(kernel_name="python3").client_factory()
    return [(f"{owner} {name}", getattr(kc, f"{name}_channel_class")) for owner, kc in
            (("hands", hands), ("fidelity reference", reference)) for name in ("shell", "control", "stdin")]


@pytest.mark.asyncio
@pytest.mark.parametrize("owner,channel_class", kernel_clients(), ids=lambda v: v if isinstance(v, str) else "")
async def test_a_send_leaves_the_waiting_receive_able_to_wake(owner, channel_class):
    assert issubclass(channel_class, WakingChannel), owner
    reply = await send_while_a_reply_waits(channel_class)
    assert reply["msg_type"] == "kernel_info_reply" and reply["content"] == {"status": "ok"}
