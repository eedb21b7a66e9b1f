"""A small pooled HTTP/1.1 client for talking to children: llhttp (httptools) on Trio sockets.

The relay's hot path. Each child keeps a stack of idle keep-alive connections (the
most recently used first, no scanning); a request goes out in one write; the answer
is read as `troupe.proxy.answer` says.

Connections are pooled per child, keyed by (model, generation), never by port: a
port is reused by the next child, and a connection to a child that is gone must
never be handed out again. The scheduler calls `UpstreamPool.forget` when a child
exits, which closes that child's idle connections at once (60 swaps used to leave
hundreds of descriptors open) and makes any still in use close when they finish.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Protocol

import attrs
import trio

from troupe.proxy.answer import ChildConnection, Stale, UpstreamError, UpstreamResponse

__all__ = [
    "Child",
    "ChildRef",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "render_request",
]

MAX_IDLE_PER_PORT = 64


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


def render_request(
    method: str, target: str, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """One HTTP/1.1 request, head and body, ready for a single write."""
    parts = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
    for key, value in headers:
        parts += (key, b": ", value, b"\r\n")
    parts.append(b"content-length: %d\r\n\r\n" % len(body))
    parts.append(body)
    return b"".join(parts)


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
        self._idle: dict[_Key, list[ChildConnection]] = {}
        self._gone: dict[str, int] = {}  # model -> newest generation known to be gone
        self._closed = False

    @property
    def idle_count(self) -> int:
        """Idle pooled connections, all children together (tests, metrics)."""
        return sum(len(conns) for conns in self._idle.values())

    def _is_gone(self, key: _Key) -> bool:
        return self._closed or key[1] <= self._gone.get(key[0], -1)

    def _put(self, key: _Key, conn: ChildConnection) -> None:
        """Pool a finished connection; one to a child that is gone is closed instead."""
        idle = None if self._is_gone(key) else self._idle.setdefault(key, [])
        if idle is not None and len(idle) < MAX_IDLE_PER_PORT:
            idle.append(conn)
        else:
            conn.close_now()

    def forget(self, model: str, gen: int) -> None:
        """The child ``(model, gen)`` (and every older one of ``model``) is gone: close
        its idle connections now; connections still in use close when they finish."""
        if gen > self._gone.get(model, -1):
            self._gone[model] = gen
        for key in [k for k in self._idle if k[0] == model and k[1] <= gen]:
            for conn in self._idle.pop(key):
                conn.close_now()

    async def _connect(self, port: int) -> ChildConnection:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setblocking(False)
        sock = trio.socket.from_stdlib_socket(raw)
        try:
            with trio.fail_after(self.connect_timeout):
                await sock.connect((self.host, port))
        except trio.TooSlowError:
            sock.close()
            raise UpstreamError("Connection timeout") from None
        except OSError as exc:
            sock.close()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise UpstreamError(f"Could not establish connection ({reason})") from None
        except BaseException:
            sock.close()
            raise
        return ChildConnection(trio.SocketStream(sock), raw, self.read_timeout)  # TCP_NODELAY set

    async def request(
        self,
        child: Child,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        """Send one request and wait for the answer's status and headers (``headers``
        without Content-Length: it is computed)."""
        return await self.send(child, render_request(method, target, headers, body))

    async def send(self, child: Child, wire: bytes) -> UpstreamResponse:
        """`request` with the request already rendered (`render_request`).

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
                return await self._exchange(key, conn, wire)
            except Stale:
                pass
        conn = await self._connect(child.port)
        try:
            return await self._exchange(key, conn, wire)
        except Stale as exc:
            raise UpstreamError(str(exc)) from None

    async def _exchange(self, key: _Key, conn: ChildConnection, wire: bytes) -> UpstreamResponse:
        try:
            try:
                await conn.stream.send_all(wire)
            except (trio.BrokenResourceError, OSError) as exc:
                raise Stale(f"connection to the child failed: {exc}") from None
            first = await conn.read_head()
            return UpstreamResponse(conn, first, lambda done: self._put(key, done))
        except BaseException:
            conn.close_now()
            raise

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close_now()
        await trio.lowlevel.checkpoint()
