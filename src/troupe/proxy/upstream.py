"""One HTTP/1.1 exchange with a child, h11 on a Trio socket: the connection and the
answer read from it. The pool that owns the connections is in pool.py.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import attrs
import h11
import trio

if TYPE_CHECKING:
    from troupe.proxy.pool import UpstreamPool

__all__ = ["Child", "ChildRef", "Connection", "Key", "UpstreamError", "UpstreamResponse"]

READ_SIZE = 65536


class UpstreamError(Exception):
    """The child could not be reached, or broke the connection."""


class Child(Protocol):
    """Which child a request goes to: the scheduler's lease (`Grant`) is one."""

    @property
    def model(self) -> str: ...

    @property
    def gen(self) -> int: ...

    @property
    def port(self) -> int: ...


@attrs.frozen
class ChildRef:
    model: str
    gen: int
    port: int


Key = tuple[str, int]  # (model, generation)


class Connection:
    def __init__(self, stream: trio.SocketStream, read_timeout: float | None) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.read_timeout = read_timeout  # longest silence from the child (--timeout)
        self.used = False  # carried a request already (a pooled one may have gone stale)

    async def next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.move_on_after(self.read_timeout or math.inf) as scope:
                data = await self.stream.receive_some(READ_SIZE)
            if scope.cancelled_caught:
                raise UpstreamError("Read timeout")
            self.h11.receive_data(data)  # b"" marks end of stream

    @property
    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE


class UpstreamResponse:
    """Status and headers of a child's answer; the body is read with `chunks`."""

    def __init__(self, pool: UpstreamPool, key: Key, conn: Connection, head: h11.Response) -> None:
        self._pool = pool
        self._key = key
        self._conn: Connection | None = conn
        self.status_code = head.status_code
        self.headers: list[tuple[bytes, bytes]] = list(head.headers)

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Not an async generator (none is left for the garbage
        collector when a client disconnects midway)."""
        return _Chunks(self)

    async def aclose(self) -> None:
        """Done with this answer: a fully read keep-alive connection goes back to the
        pool; anything else is closed, which tells the child to stop."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._pool.checkin(self._key, conn, reusable=conn.reusable)

    async def _next(self) -> bytes | None:
        conn = self._conn
        if conn is None:
            return None
        try:
            event = await conn.next_event()
        except (h11.RemoteProtocolError, trio.BrokenResourceError, OSError) as exc:
            raise UpstreamError(f"connection to the child broke: {exc}") from exc
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            return None
        if isinstance(event, h11.ConnectionClosed):
            raise UpstreamError("the child closed the connection mid-response")
        return b""  # nothing for the body (an informational event); keep reading


class _Chunks:
    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        while True:
            chunk = await self._response._next()
            if chunk is None:
                raise StopAsyncIteration
            if chunk:
                return chunk
