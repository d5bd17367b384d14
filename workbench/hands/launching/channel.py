"""A kernel process's iopub socket, read with bounds: what kernel code sends there is hostile input.

Kernel code holds the kernel's session key and its sockets, so it can put anything on iopub: a
message of any size, bytes that are not JSON, a header without a type, content that is not an
object, a forged signature. The hands therefore read iopub themselves rather than through
jupyter_client's channel, and everything that is not a well-formed message of the call in
flight is dropped here, most of it with a note (`Dropped`) the model reads:

- ZMQ refuses a frame over `max_message` bytes before allocating it (MAXMSGSIZE on the socket,
  set by `HandsKernelClient`) and drops the connection; a socket monitor sees that, the reader
  connects again at once and says what was lost (whatever the kernel sent meanwhile is gone too).
  A message of many frames, each under the limit, is dropped after it arrived, unparsed.
- A reader task drains the socket into an inbox all the time, so nothing piles up in ZMQ's queue
  between calls; only messages of the call in flight (`expect`) are kept, within a byte budget.
- Each message is deserialized (signature checked) here; one that fails becomes a note.

The kernel client's channels (`WakingChannel`) also mend a missed wake-up of jupyter_client's: it sends
through a blocking twin of the asyncio socket, and that send takes in the socket's pending notifications
(ZMQ's edge-triggered FD), so a reply that had arrived no longer woke a receive already waiting on that
socket: it waited for its whole timeout (nbclient: the cell's 120 s) with the reply there.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from hmac import compare_digest
from typing import Any

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.connect import channel_socket_types
from traitlets import Type
from zmq.utils.monitor import parse_monitor_message

from ..base import Dropped

MAX_MESSAGE = 16 * 1024 * 1024  # the default of HandsSettings.max_message_mb, in bytes
PARSE_IN_THREAD = 1 << 20  # messages over this many bytes are parsed off the event loop
MAX_NOTES = 5  # notes of dropped messages per call; after them one that says there were more
SMALL = 64 * 1024  # a message this small (a status, a line of output) may use the reserve when the inbox is full
RESERVE = 4 * 1024 * 1024  # bytes beyond the inbox's budget for small messages, so the call's end is not lost
FAIR_TURN = 0.005  # seconds a reader reads on before it lets the rest of the event loop run


def inbox_budget(max_message: int) -> int:
    """Bytes of a call's messages that may wait to be read at once (the rest is dropped with a note)."""
    return 4 * max_message


class WakingChannel(AsyncZMQSocketChannel):
    """jupyter_client's channel, except that a send leaves a receive waiting on the same socket able to wake."""

    def send(self, msg: dict[str, Any]) -> None:
        super().send(msg)
        # the send went through a blocking twin of this socket (jupyter_client's Session.send), which took in the
        # socket's pending notifications: a message that had arrived raises no edge on the FD any more, so a
        # poll or receive already waiting (nbclient's for the execute reply, while its iopub side sends an Output
        # widget's state) would sleep on. Reading EVENTS through the asyncio socket makes it look again.
        if self.socket is not None:
            self.socket.get(zmq.EVENTS)


class WakingKernelClient(AsyncKernelClient):
    """An async kernel client whose sends cannot leave a waiting receive asleep (`WakingChannel`)."""

    shell_channel_class = Type(WakingChannel)
    control_channel_class = Type(WakingChannel)
    stdin_channel_class = Type(WakingChannel)


class HandsKernelClient(WakingKernelClient):
    """A kernel client whose sockets refuse messages over `max_message` bytes (ZMQ's MAXMSGSIZE)."""

    max_message = MAX_MESSAGE  # set before the channels start: ZMQ applies it when a socket connects

    def _create_connected_socket(self, channel: str, identity: bytes | None = None) -> zmq.Socket:
        # jupyter_client's, with the limit set before connect (ZMQ reads it when the connection starts)
        sock = self.context.socket(channel_socket_types[channel])
        # no linger: the hands close a client only with its kernel going, and a message still queued for a
        # dead kernel would hold the context's termination (and the event loop) for the whole linger
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message)
        if identity:
            sock.identity = identity
        if self.curve_publickey is not None:
            sock.curve_secretkey, sock.curve_publickey = self.curve_secretkey, self.curve_publickey
            sock.curve_serverkey = self.curve_publickey
        sock.connect(self._make_url(channel))
        return sock


def _size(frames: list[zmq.Frame]) -> int:
    return sum(len(f) for f in frames)


class IOPub:
    """One kernel's iopub, drained by a task into an inbox that keeps only the call in flight's messages."""

    def __init__(self, client: HandsKernelClient, max_message: int):
        self.sock: Any = client.iopub_channel.socket
        self.session, self.url = client.session, client._make_url("iopub")
        self.max_message, self.budget = max_message, inbox_budget(max_message)  # bytes waiting in the inbox, at most
        self.current: str | None = None  # the msg_id of the call in flight
        self.inbox: deque[tuple[str, dict[str, Any], int] | Dropped] = deque()
        self.waiting = 0  # bytes of the messages in the inbox
        self.lost_at: float | None = None  # when output of the current call was last lost
        self._notes = 0  # notes of dropped messages for the current call
        self._overflow = 0
        self._arrived = asyncio.Event()
        self._monitor: Any = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read()), loop.create_task(self._watch())]

    def expect(self, msg_id: str) -> None:
        """From now on keep the messages of request `msg_id` (and forget what is waiting)."""
        self.current, self.lost_at = msg_id, None
        self.inbox.clear()
        self.waiting, self._overflow, self._notes = 0, 0, 0

    async def next(self, msg_id: str, timeout: float) -> tuple[str, dict[str, Any]] | Dropped | None:
        """The next message of `msg_id` (or a note of what was dropped); None after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            self._arrived.clear()
            while self.inbox:
                item = self.inbox.popleft()
                if isinstance(item, Dropped):
                    return item
                msg_type, content, size = item
                self.waiting -= size
                if msg_id == self.current:
                    return msg_type, content
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                # not wait_for: in 3.11 it swallows a cancel that lands as the event is set
                async with asyncio.timeout(left):
                    await self._arrived.wait()
            except TimeoutError:
                return None

    def end(self, msg_id: str, note: Dropped | None) -> tuple[str, dict[str, Any]] | Dropped:
        """The end of call `msg_id` when its idle status did not come: the note first (if any), then the status."""
        idle = ("status", {"execution_state": "idle"})
        if note is None or msg_id != self.current:
            return idle
        self.lost_at = time.monotonic()
        self.inbox.append((*idle, 0))
        return note

    def _put(self, item: tuple[str, dict[str, Any], int] | Dropped) -> None:
        self.inbox.append(item)
        self._arrived.set()

    def _drop(self, note: str) -> None:
        """A message that claims (or may claim) the current call was dropped: a note, at most a few per call."""
        if self.current is None:
            return
        self._notes += 1
        if self._notes <= MAX_NOTES:
            self._put(Dropped(note))
        elif self._notes == MAX_NOTES + 1:
            self._put(Dropped("[more messages from the kernel were dropped, for the reasons above or others]"))

    async def _read(self) -> None:
        turn = time.monotonic() + FAIR_TURN
        while True:
            try:
                frames = await self.sock.recv_multipart(copy=False)
            except zmq.ZMQError:  # the socket was closed under us: the kernel is being stopped
                return
            # a receive with a message waiting returns without giving up the event loop, so a kernel that floods
            # would hold the loop (every other session's reader too: their queues fill, and ZMQ drops the rest)
            if (now := time.monotonic()) >= turn:
                await asyncio.sleep(0)
                turn = now + FAIR_TURN
            size = _size(frames)
            if size > self.max_message:
                self.lost_at = time.monotonic()
                self._drop(f"[a message from the kernel was dropped unread: {size:,} bytes in {len(frames)} parts, "
                           f"over the {self.max_message:,} the hands read (max_message_mb)]")
                continue
            parsed = await asyncio.to_thread(self._parse, frames) if size > PARSE_IN_THREAD else self._parse(frames)
            if parsed is None:
                continue
            if isinstance(parsed, str):
                self._drop(f"[a malformed message from the kernel was dropped: {parsed}]")
            elif self.waiting + size > self.budget + (RESERVE if size <= SMALL else 0):
                self.lost_at = time.monotonic()
                if not self._overflow:
                    self._put(Dropped(f"[some of the kernel's output was dropped: more than {self.budget:,} bytes of it "
                                      "waited to be read at once]"))
                self._overflow += 1
            else:
                self.waiting += size
                self._put((*parsed, size))

    def _parse(self, frames: list[zmq.Frame]) -> tuple[str, dict[str, Any]] | str | None:
        """(msg_type, content) of a message of the current call; None for another request's; else why it is malformed."""
        session = self.session
        try:
            _, parts = session.feed_identities(frames, copy=False)
            if len(parts) < 5:
                return f"it has {len(parts)} parts after the delimiter, not at least 5"
            signature, header, packed_parent, metadata, content = (p.bytes for p in parts[:5])
            parent = session.unpack(packed_parent)
        except Exception as e:  # any exception: these are the kernel's bytes
            return f"its envelope is unreadable ({type(e).__name__})"
        if isinstance(parent, dict) and parent.get("msg_id") != self.current:
            return None  # another request's (an earlier cell's, the setup's): not this call's business
        # jupyter_client's Session.deserialize checks the same signature, and then parses dates in the headers and
        # adapts old protocol versions, which the hands use neither of: that was half of a message's cost
        try:
            if session.auth is not None:
                if not signature:
                    raise ValueError("Unsigned Message")
                if not compare_digest(signature, session.sign([header, packed_parent, metadata, content])):
                    raise ValueError(f"Invalid Signature: {signature!r}")
            header, content = session.unpack(header), session.unpack(content)
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:200]}"
        msg_type = header.get("msg_type") if isinstance(header, dict) else None
        if not isinstance(parent, dict):
            return "its parent header is not an object"
        if not isinstance(msg_type, str) or not isinstance(content, dict):
            return "its type is not a string or its content is not an object"
        return msg_type, content

    async def _watch(self) -> None:
        """A dropped connection (ZMQ refused a frame over MAXMSGSIZE): say so and connect again."""
        while True:
            try:
                event = parse_monitor_message(await self._monitor.recv_multipart())
            except zmq.ZMQError:
                return
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            # ZMQ does not reconnect after a protocol error (a frame over MAXMSGSIZE is one)
            try:
                self.sock.disconnect(self.url)
            except zmq.ZMQError:
                pass
            self.sock.connect(self.url)
            self.sock.get(zmq.EVENTS)  # connect took in the socket's notifications: let the waiting reader look again
            self.lost_at = time.monotonic()
            self._drop(f"[output was lost: the kernel sent a message over the {self.max_message:,} bytes the hands read "
                       "(max_message_mb), so its output channel was reset; what it sent just before and after is gone "
                       "too]")

    def close(self) -> None:
        """Stop reading; the socket itself closes with the client's channels."""
        for task in self._tasks:
            task.cancel()
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
