"""The realtime session actor: one WebSocket connection, its conversation, its response.

Its own task group holds a reader (client messages into a bounded inbox), the
handler loop (one client event at a time, in order), and at most one running
response as a cancellable child task. The reader ending (the client left) ends the
session: the response is cancelled, the child stops generating, the lease is given
back. Every outgoing event goes through `Session.emit`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio
from trio_websocket import ConnectionClosed

from troupe.realtime.config import SessionConfig
from troupe.realtime.conversation import Conversation
from troupe.realtime.dispatch import handle_event
from troupe.realtime.events import Ids, RealtimeError, dumps, error_event, new_id
from troupe.realtime.lease import ChildCall
from troupe.realtime.transcribe import AudioBuffer

__all__ = ["Connection", "Keepalive", "Limits", "Session", "SessionModel"]

log = logging.getLogger("troupe.realtime")

Event = dict[str, Any]


class Connection(Protocol):
    """What a session needs of an accepted WebSocket (trio-websocket's connection)."""

    async def get_message(self) -> str | bytes: ...

    async def send_message(self, message: str | bytes) -> None: ...

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None: ...


@attrs.frozen
class Limits:
    max_items: int = 4096  # conversation items
    max_conversation_bytes: int = 64 << 20  # text, arguments and audio together
    max_audio_bytes: int = 15 << 20  # buffered input audio (~5 min of 24 kHz PCM)
    inbox: int = 64  # client events read ahead of the handler


@attrs.frozen
class Keepalive:
    """A session's bounded life: ``ping`` every ``interval`` (a peer that does not
    answer within as long is gone), and a close once the client has said nothing for
    ``idle`` seconds while no response runs."""

    ping: Callable[[], Awaitable[None]]
    interval: float
    idle: float


@attrs.frozen
class SessionModel:
    """The model a session talks to, as the handshake resolved it."""

    name: str
    names: frozenset[str]  # name and aliases
    modalities: Callable[[], tuple[tuple[str, ...], tuple[str, ...]]]  # (inputs, outputs)


class Session:
    def __init__(
        self,
        conn: Connection,
        model: SessionModel,
        call: ChildCall,
        config: SessionConfig,
        limits: Limits,
        stop: trio.Event | None = None,
        keepalive: Keepalive | None = None,
    ) -> None:
        self.conn = conn
        self._keepalive = keepalive
        self.last_heard = trio.current_time()  # the client's last message
        self.model = model
        self.call = call
        self.config = config
        self.limits = limits
        self._stop = stop  # set when troupe shuts down
        self.conversation = Conversation(limits.max_items, limits.max_conversation_bytes)
        self.audio = AudioBuffer(limits.max_audio_bytes)
        self.conversation_id = new_id("conv")
        self.response: Any = None  # the running ResponseRun, if any
        self._ids = Ids()
        self._nursery: trio.Nursery | None = None
        # For the session's access record: tokens the child reported (input, output)
        # over its responses, message bytes each way.
        self.tokens: tuple[int, int] = (0, 0)
        self.bytes_in = 0
        self.bytes_out = 0

    def count_usage(self, usage: Event | None) -> None:
        """A response ended: add the tokens its ``usage`` (the Realtime API's) counts."""
        if usage:
            inp, out = self.tokens
            self.tokens = (inp + int(usage.get("input_tokens") or 0),
                           out + int(usage.get("output_tokens") or 0))  # fmt: skip

    # ----- the actor ---------------------------------------------------------------------

    async def run(self) -> None:
        inbox_send, inbox = trio.open_memory_channel[str | bytes](self.limits.inbox)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._read, inbox_send)
            if self._stop is not None:
                nursery.start_soon(self._close_on_stop, self._stop)
            if self._keepalive is not None:
                nursery.start_soon(self._keep_alive, self._keepalive)
            await self.emit({"type": "session.created", "session": self.config.to_json()})
            async with inbox:
                async for message in inbox:
                    await handle_event(self, message)
            nursery.cancel_scope.cancel()  # the client left: stop the response

    async def _read(self, inbox: trio.MemorySendChannel[str | bytes]) -> None:
        async with inbox:
            while True:
                try:
                    message = await self.conn.get_message()
                except ConnectionClosed:
                    return
                self.last_heard = trio.current_time()
                self.bytes_in += len(message.encode() if isinstance(message, str) else message)
                await inbox.send(message)

    async def _close_on_stop(self, stop: trio.Event) -> None:
        await stop.wait()
        with trio.move_on_after(1):
            await self.conn.aclose(1001, "troupe is shutting down")
        self.cancel()

    async def _keep_alive(self, keep: Keepalive) -> None:
        while True:
            await trio.sleep(keep.interval)  # a timer: nothing to wait for but the clock
            if self.response is None and trio.current_time() - self.last_heard >= keep.idle:
                log.info("realtime session idle for %gs: closing", keep.idle)
                reason = f"idle for {keep.idle:g} s"
                break
            answered = False
            with trio.move_on_after(keep.interval):
                try:
                    await keep.ping()
                    answered = True
                except ConnectionClosed:
                    pass
            if not answered:
                log.info("realtime client answered no ping within %gs: closing", keep.interval)
                reason = "no pong"
                break
        with trio.move_on_after(1):
            await self.conn.aclose(1001, reason)
        self.cancel()

    def cancel(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def start(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run ``task`` as a child of the session (a response, a transcription)."""
        assert self._nursery is not None
        self._nursery.start_soon(task)

    # ----- sending -----------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        event["event_id"] = self._ids.event()
        text = dumps(event)
        self.bytes_out += len(text.encode())
        try:
            await self.conn.send_message(text)
        except ConnectionClosed:
            # The client is gone: the session ends here, whichever task was sending.
            self.cancel()
            await trio.lowlevel.checkpoint()

    async def emit_error(self, error: RealtimeError, client_event_id: str | None = None) -> None:
        await self.emit(error_event("", error, client_event_id))
