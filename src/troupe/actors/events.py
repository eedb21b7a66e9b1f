"""The event bus behind ``GET /models/sse``: one bounded channel per subscriber.

Publishing never blocks: a subscriber whose buffer is full is dropped (its stream
ends), so a slow client can never stall the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

__all__ = ["EventBus"]

log = logging.getLogger(__name__)

Event = dict[str, Any]


class EventBus:
    def __init__(self, buffer: int = 256) -> None:
        self._buffer = buffer
        self._subscribers: set[trio.MemorySendChannel[Event]] = set()
        self._closed = False
        self._joined = trio.Event()  # set (and renewed) whenever someone subscribes

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, event: Event) -> None:
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                log.warning("dropping a slow /models/sse subscriber")
                self._drop(send)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._drop(send)

    @contextmanager
    def subscribe(self) -> Iterator[trio.MemoryReceiveChannel[Event]]:
        """Events published from now on; the channel ends when dropped or at `close`."""
        send, recv = trio.open_memory_channel[Event](self._buffer)
        if self._closed:
            send.close()
        else:
            self._subscribers.add(send)
            self._joined.set()
            self._joined = trio.Event()
        try:
            yield recv
        finally:
            self._drop(send)
            recv.close()

    async def wait_for_subscribers(self, count: int = 1) -> None:
        """Return once at least ``count`` streams are subscribed (tests, dashboards)."""
        while len(self._subscribers) < count:
            await self._joined.wait()

    def close(self) -> None:
        """End every stream (shutdown): subscribers see end-of-channel at once."""
        self._closed = True
        for send in list(self._subscribers):
            self._drop(send)

    def _drop(self, send: trio.MemorySendChannel[Event]) -> None:
        self._subscribers.discard(send)
        send.close()
