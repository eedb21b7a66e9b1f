"""The pool of keep-alive connections to every child: the one transport to children.

The relay's hot path. httpx cost about half of troupe's CPU per proxied request
(bench/proxy.py): it scans its whole pool on every request and writes headers and
body separately. Here each child keeps a stack of idle keep-alive connections (the
most recently used first, no scanning), and a request goes out in one write.

Connections are pooled per child, keyed by (model, generation), never by port: a
port is reused by the next child, and a connection to a child that is gone must
never be handed out again. The scheduler calls `UpstreamPool.forget` when it stops a
child and when a child exits: its idle connections close at once (60 swaps used to
leave hundreds of descriptors open; an idle one also holds llama-server's exit about
110 ms), and those still in use close when they finish.

Each child gets at most `set_limit` connections, idle ones included; a request
beyond waits here, first come first served, for one to come back. llama-server
binds a worker thread to each keep-alive connection, and a connection it cannot
give a worker waits out another's 5 s keep-alive timeout (child/http_threads.py).
"""

from __future__ import annotations

import contextlib
import socket
from collections import deque
from collections.abc import Sequence

import attrs
import h11
import trio

from troupe.proxy.upstream import Child, Connection, Key, UpstreamError, UpstreamResponse

__all__ = ["DEFAULT_LIMIT", "UpstreamPool"]

DEFAULT_LIMIT = 7  # llama-server's own default: max(4 + 4, cpus - 1) workers, less a spare


@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)
    conn: Connection | None = None  # an idle connection handed over
    may_open: bool = False  # a slot handed over: open a new connection in it


@attrs.define
class _Child:
    limit: int = DEFAULT_LIMIT
    open: int = 0  # connections open to it, idle or in use
    idle: list[Connection] = attrs.field(factory=list)
    waiting: deque[_Waiter] = attrs.field(factory=deque)


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
        self._children: dict[Key, _Child] = {}
        self._gone: dict[str, int] = {}  # model -> newest generation known to be gone
        self._closed = False

    # ----- bookkeeping (the scheduler's side) ---------------------------------------------

    @property
    def idle_count(self) -> int:
        """Idle pooled connections, all children together (tests, metrics)."""
        return sum(len(c.idle) for c in self._children.values())

    @property
    def open_count(self) -> int:
        """Open connections, idle or in use, all children together."""
        return sum(c.open for c in self._children.values())

    def set_limit(self, model: str, gen: int, limit: int) -> None:
        """The child ``(model, gen)`` serves ``limit`` connections at once."""
        if not self._is_gone((model, gen)):
            state = self._children.setdefault((model, gen), _Child())
            state.limit = max(1, limit)
            self._wake(state)

    def forget(self, model: str, gen: int) -> None:
        """The child ``(model, gen)`` (and every older one of ``model``) is stopping or
        gone: close its idle connections now; those in use close when they finish;
        requests waiting for one fail."""
        if gen > self._gone.get(model, -1):
            self._gone[model] = gen
        for key in [k for k in self._children if k[0] == model and k[1] <= gen]:
            state = self._children[key]
            for conn in state.idle:
                conn.stream.socket.close()
            state.open -= len(state.idle)
            state.idle.clear()
            while state.waiting:
                state.waiting.popleft().event.set()  # they see it gone
            if state.open <= 0:
                del self._children[key]

    def _is_gone(self, key: Key) -> bool:
        return self._closed or key[1] <= self._gone.get(key[0], -1)

    # ----- connections --------------------------------------------------------------------

    async def _checkout(self, key: Key, port: int) -> Connection:
        """An idle connection, a new one within the limit, or the next one given back."""
        while True:
            if self._is_gone(key):
                raise UpstreamError("the model's server has exited")
            state = self._children.setdefault(key, _Child())
            if not state.waiting:  # nobody ahead in line
                if state.idle:
                    return state.idle.pop()
                if state.open < state.limit:
                    state.open += 1
                    return await self._open_counted(key, state, port)
            waiter = _Waiter()
            state.waiting.append(waiter)
            try:
                await waiter.event.wait()
            except BaseException:
                self._leave_line(key, state, waiter)
                raise
            if waiter.conn is not None:
                return waiter.conn
            if waiter.may_open:
                return await self._open_counted(key, state, port)
            # woken without a connection: the child is gone (checked at the top)

    def _leave_line(self, key: Key, state: _Child, waiter: _Waiter) -> None:
        """A waiter cancelled: whatever was handed to it goes to the next in line."""
        if waiter in state.waiting:
            state.waiting.remove(waiter)
        elif waiter.conn is not None:
            self.checkin(key, waiter.conn, reusable=True)
        elif waiter.may_open:
            state.open -= 1
            self._wake(state)

    async def _open_counted(self, key: Key, state: _Child, port: int) -> Connection:
        """Connect, in a slot already counted in ``state.open``."""
        try:
            return await self._connect(port)
        except BaseException:
            state.open -= 1
            self._wake(state)
            if state.open <= 0 and self._is_gone(key):
                self._children.pop(key, None)
            raise

    def checkin(self, key: Key, conn: Connection, *, reusable: bool) -> None:
        """A connection's answer is over: pool it (to the next in line first), or close
        it (a child that is gone, an answer cut short)."""
        state = self._children.get(key)
        if state is None or not reusable or self._is_gone(key):
            conn.stream.socket.close()
            if state is not None:
                state.open -= 1
                self._wake(state)
                if state.open <= 0 and self._is_gone(key):
                    del self._children[key]
            return
        conn.h11.start_next_cycle()
        if state.waiting:
            waiter = state.waiting.popleft()
            waiter.conn = conn
            waiter.event.set()
        else:
            state.idle.append(conn)

    def _wake(self, state: _Child) -> None:
        """A slot is free: the first in line may open a connection in it."""
        if state.waiting and state.open < state.limit:
            waiter = state.waiting.popleft()
            waiter.may_open = True
            state.open += 1
            waiter.event.set()

    async def _connect(self, port: int) -> Connection:
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(self.host, port)
        except trio.TooSlowError:
            raise UpstreamError("Connection timeout") from None
        except OSError as exc:
            raise UpstreamError(f"Could not establish connection ({exc.strerror or exc})") from None
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Connection(stream, self.read_timeout)

    # ----- requests -----------------------------------------------------------------------

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
        while True:  # each stale pooled connection is closed, so this ends
            conn = await self._checkout(key, child.port)
            fresh = not conn.used
            try:
                return await self._exchange(key, conn, method, target, headers, body)
            except _Stale as exc:
                if fresh:
                    raise UpstreamError(str(exc)) from None

    async def _exchange(
        self,
        key: Key,
        conn: Connection,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        all_headers = [*headers, (b"content-length", str(len(body)).encode())]
        try:
            conn.used = True
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
            self.checkin(key, conn, reusable=False)
            raise _Stale(f"connection to the child failed: {exc}") from None
        except BaseException:
            self.checkin(key, conn, reusable=False)
            raise

    async def aclose(self) -> None:
        self._closed = True
        children, self._children = self._children, {}
        for state in children.values():
            for conn in state.idle:
                with contextlib.suppress(Exception):
                    await conn.stream.aclose()
            while state.waiting:
                state.waiting.popleft().event.set()


class _Stale(Exception):
    pass
