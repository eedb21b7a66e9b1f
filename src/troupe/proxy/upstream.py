"""A small pooled HTTP/1.1 client for talking to children: h11 on Trio sockets.

The relay's hot path. httpx cost about half of troupe's CPU per proxied request
(bench/proxy.py): it scans its whole pool on every request and writes headers and
body separately. Here each child port keeps a stack of idle keep-alive connections
(the most recently used first, no scanning), and a request goes out in one write.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import AsyncIterator, Sequence

import h11
import trio

__all__ = ["UpstreamError", "UpstreamPool", "UpstreamResponse"]

READ_SIZE = 65536
MAX_IDLE_PER_PORT = 64


class UpstreamError(Exception):
    """The child could not be reached, or broke the connection."""


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
        self, pool: UpstreamPool, port: int, conn: _Connection, head: h11.Response
    ) -> None:
        self._pool = pool
        self._port = port
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
            conn.h11.start_next_cycle()
            self._pool._put(self._port, conn)
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
    """Keep-alive connections to ``127.0.0.1:<port>`` of each child."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
    ) -> None:
        self.host = host
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[int, list[_Connection]] = {}

    def _put(self, port: int, conn: _Connection) -> None:
        idle = self._idle.setdefault(port, [])
        if len(idle) < MAX_IDLE_PER_PORT:
            idle.append(conn)
        else:
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
        port: int,
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
        idle = self._idle.get(port)
        if idle:
            conn = idle.pop()
            try:
                return await self._exchange(port, conn, method, target, headers, body)
            except _Stale:
                pass
        conn = await self._connect(port)
        try:
            return await self._exchange(port, conn, method, target, headers, body)
        except _Stale as exc:
            raise UpstreamError(str(exc)) from None

    async def _exchange(
        self,
        port: int,
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
                    return UpstreamResponse(self, port, conn, event)
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
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                with contextlib.suppress(Exception):
                    await conn.stream.aclose()


class _Stale(Exception):
    pass
