"""A small pooled HTTP/1.1 client for talking to children: h11 on Trio sockets.

The relay's hot path. httpx cost about half of troupe's CPU per proxied request
(bench/proxy.py): it scans its whole pool on every request and writes headers and
body separately. Here each child keeps a stack of idle keep-alive connections (the
most recently used first, no scanning), and a request goes out in one write.

Connections are pooled per child, keyed by (model, generation), never by port: a
port is reused by the next child, and a connection to a child that is gone must
never be handed out again. The scheduler calls `UpstreamPool.forget` when a child
exits, which closes that child's idle connections at once (60 swaps used to leave
hundreds of descriptors open) and makes any still in use close when they finish.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import attrs
import h11
import trio

__all__ = ["Child", "ChildRef", "UpstreamError", "UpstreamPool", "UpstreamResponse"]

READ_SIZE = 65536
MAX_IDLE_PER_PORT = 64


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


_Key = tuple[str, int]  # (model, generation)


class _Connection:
    def __init__(self, stream: trio.SocketStream, read_timeout: float | None) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.read_timeout = read_timeout  # longest silence from the child (--timeout)

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

    def __init__(
        self, pool: UpstreamPool, key: _Key, conn: _Connection, head: h11.Response
    ) -> None:
        self._pool = pool
        self._key = key
        self._conn: _Connection | None = conn
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
        if conn.reusable:
            self._pool._put(self._key, conn)  # or closed, if that child is gone
        else:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await conn.stream.aclose()

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


class UpstreamPool:
    """Keep-alive connections to ``127.0.0.1:<port>`` of each child, per (model, gen)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
    ) -> None:
        self.host = host
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[_Key, list[_Connection]] = {}
        self._gone: dict[str, int] = {}  # model -> newest generation known to be gone
        self._closed = False

    @property
    def idle_count(self) -> int:
        """Idle pooled connections, all children together (tests, metrics)."""
        return sum(len(conns) for conns in self._idle.values())

    def _is_gone(self, key: _Key) -> bool:
        return self._closed or key[1] <= self._gone.get(key[0], -1)

    def _put(self, key: _Key, conn: _Connection) -> None:
        """Pool a finished connection; one to a child that is gone is closed instead."""
        idle = None if self._is_gone(key) else self._idle.setdefault(key, [])
        if idle is not None and len(idle) < MAX_IDLE_PER_PORT:
            conn.h11.start_next_cycle()
            idle.append(conn)
        else:
            conn.stream.socket.close()

    def forget(self, model: str, gen: int) -> None:
        """The child ``(model, gen)`` (and every older one of ``model``) is gone: close
        its idle connections now; connections still in use close when they finish."""
        if gen > self._gone.get(model, -1):
            self._gone[model] = gen
        for key in [k for k in self._idle if k[0] == model and k[1] <= gen]:
            for conn in self._idle.pop(key):
                conn.stream.socket.close()

    async def _connect(self, port: int) -> _Connection:
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(self.host, port)
        except trio.TooSlowError:
            raise UpstreamError("Connection timeout") from None
        except OSError as exc:
            raise UpstreamError(f"Could not establish connection ({exc.strerror or exc})") from None
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(stream, self.read_timeout)

    async def request(
        self,
        child: Child,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        """Send one request and wait for the answer's status and headers.

        A pooled connection the child has closed in the meantime (llama-server closes
        some after a stream although it said keep-alive) fails before any answer; the
        request then goes once more on a new connection.
        """
        key = (child.model, child.gen)
        if self._is_gone(key):
            raise UpstreamError("the model's server has exited")
        idle = self._idle.get(key)
        if idle:
            conn = idle.pop()
            if not idle:
                del self._idle[key]
            try:
                return await self._exchange(key, conn, method, target, headers, body)
            except _Stale:
                pass
        conn = await self._connect(child.port)
        try:
            return await self._exchange(key, conn, method, target, headers, body)
        except _Stale as exc:
            raise UpstreamError(str(exc)) from None

    async def _exchange(
        self,
        key: _Key,
        conn: _Connection,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        all_headers = [*headers, (b"content-length", str(len(body)).encode())]
        try:
            # One write for the whole request: head, body and end.
            out = bytearray(
                conn.h11.send(h11.Request(method=method, target=target, headers=all_headers)) or b""
            )
            if body:
                out += conn.h11.send(h11.Data(data=body)) or b""
            out += conn.h11.send(h11.EndOfMessage()) or b""
            await conn.stream.send_all(bytes(out))
            while True:
                event = await conn.next_event()
                if isinstance(event, h11.Response):
                    return UpstreamResponse(self, key, conn, event)
                if isinstance(event, h11.ConnectionClosed):
                    raise _Stale("the child closed the connection without answering")
                # h11.InformationalResponse (100 Continue): keep waiting for the answer
        except (
            h11.RemoteProtocolError,
            h11.LocalProtocolError,
            trio.BrokenResourceError,
            OSError,
        ) as exc:
            with contextlib.suppress(Exception):
                await conn.stream.aclose()
            raise _Stale(f"connection to the child failed: {exc}") from None
        except BaseException:
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await conn.stream.aclose()
            raise

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                with contextlib.suppress(Exception):
                    await conn.stream.aclose()


class _Stale(Exception):
    pass
