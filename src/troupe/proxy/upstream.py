"""A small pooled HTTP/1.1 client for talking to children: llhttp (httptools) on Trio sockets.

The relay's hot path. Each child keeps a stack of idle keep-alive connections (the
most recently used first, no scanning); a request goes out in one write; the answer
is read as `troupe.proxy.answer` says.

This pool is the one seam to children: the relay, the KV store's calls (its slots,
tokenize, save and restore) and the ``/metrics`` scrape all go through it, keyed by
(model, generation), never by port: a port is reused by the next child, and a request
meant for a child that is gone must never reach whichever child listens there now.
The scheduler tells it a child's life: `UpstreamPool.started` (its port, how many
connections it keeps), `forget` when it stops it, `gone` when it exited. From the stop
on, every connection to it is closed at once and nothing more is sent to it, except a
``final`` request (the KV store's save before the exit command), on a connection closed
after its answer; from the exit on, nothing at all (`Gone`). An idle connection held
llama-server's exit about 110 ms (60 swaps also used to leave hundreds of descriptors
open); one in use held it for the whole stop-timeout, as llama-server does not exit
while a request waits on its stopped task loop, which will never answer it. Watchers
(`ChildWatcher`: the KV store keeps one owner per child generation) hear of each start
and exit.

A request that may have reached a child is never sent twice. A connection the child
is about to close is not pooled (llama-server closes one after every chunked answer,
though it says keep-alive), and an idle pooled connection is checked for the child's
close (a non-blocking peek: its keep-alive timeout) before it carries a request; if
it breaks anyway before any answer, the request goes again on another connection only
when none of it was written, or when it is a GET or a HEAD (which change nothing). A
POST whose bytes went out fails with the upstream error instead: the child may have
read it and started generating.

Each child keeps at most `set_limit` connections open between requests. llama-server
binds a worker thread to each keep-alive connection, and a connection it cannot
give a worker waits out another's 5 s keep-alive timeout (child/http_threads.py): so
a burst may open more (they get the child's extra threads), but every connection
beyond the limit is closed as soon as its answer is over, which frees its thread.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from collections.abc import Sequence
from typing import Protocol

import attrs
import trio

from troupe.proxy.answer import ChildConnection, Stale, UpstreamError, UpstreamResponse

__all__ = [
    "DEFAULT_LIMIT",
    "Child",
    "ChildRef",
    "ChildWatcher",
    "Gone",
    "Unreachable",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "render_request",
]

log = logging.getLogger("troupe.proxy")

DEFAULT_LIMIT = 7  # llama-server's own default: max(4 + 4, cpus - 1) workers, less a spare
_REPEATABLE = (b"GET ", b"HEAD ")  # safe to send again after a break: they change nothing


class Child(Protocol):
    """Which child a request goes to: the scheduler's lease (`Grant`) is one."""

    @property
    def model(self) -> str: ...

    @property
    def gen(self) -> int: ...

    @property
    def port(self) -> int: ...


class Unreachable(UpstreamError):
    """No connection could be made: nothing of the request left (safe to send elsewhere)."""


class Gone(UpstreamError):
    """The child generation asked for is stopping or has exited: nothing was sent (its
    port may already be another child's)."""


@attrs.frozen
class ChildRef:
    model: str
    gen: int
    port: int


class ChildWatcher(Protocol):
    """Told of each child generation's start (with its port) and exit (`UpstreamPool.watch`)."""

    def child_started(self, child: ChildRef) -> None: ...

    def child_gone(self, model: str, gen: int) -> None: ...


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


@attrs.define
class _Child:
    limit: int = DEFAULT_LIMIT  # connections kept open between requests
    open: int = 0  # connections open to it, idle or in use
    idle: list[ChildConnection] = attrs.field(factory=list)
    busy: set[ChildConnection] = attrs.field(factory=set)  # handed out, answer not over


class UpstreamPool:
    """Keep-alive connections to ``127.0.0.1:<port>`` of each child, per (model, gen)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.tls = tls  # connections over TLS (a cluster node at an https URL)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._children: dict[_Key, _Child] = {}
        self._stopped: dict[str, int] = {}  # model -> newest generation stopping or gone
        self._gone: dict[str, int] = {}  # model -> newest generation known to have exited
        self._live: dict[str, ChildRef] = {}  # model -> its running child, not stopping
        self._known: dict[_Key, ChildRef] = {}  # every started child not yet gone
        self._watchers: list[ChildWatcher] = []
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

    def watch(self, watcher: ChildWatcher) -> None:
        """``watcher`` hears of every child started and gone from now on."""
        self._watchers.append(watcher)

    def started(self, model: str, gen: int, port: int, limit: int = DEFAULT_LIMIT) -> None:
        """The child ``(model, gen)`` started on ``port`` and keeps ``limit`` connections
        (its fixed workers). Every older generation of ``model`` is gone: one child of a
        model runs at a time."""
        if self._closed or self._is_gone((model, gen)) or self._stopped.get(model, -1) >= gen:
            return  # reported after its stop or exit: changes nothing
        if gen - 1 > self._gone.get(model, -1):
            self.gone(model, gen - 1)
        self.set_limit(model, gen, limit)
        ref = ChildRef(model, gen, port)
        self._known[(model, gen)] = ref
        self._live[model] = ref
        for watcher in list(self._watchers):
            try:
                watcher.child_started(ref)
            except Exception:  # a watcher's bug must not take the transport down
                log.exception("a watcher of %s's child failed", model)

    def set_limit(self, model: str, gen: int, limit: int) -> None:
        """The child ``(model, gen)`` keeps ``limit`` connections (its fixed workers)."""
        if not self._is_stopped((model, gen)):
            self._children.setdefault((model, gen), _Child()).limit = max(1, limit)

    def live(self, model: str) -> ChildRef | None:
        """``model``'s child that started and is neither stopping nor gone: what a caller
        without a lease (a metrics scrape) may ask; None when there is none."""
        return self._live.get(model)

    def child(self, model: str, gen: int) -> ChildRef | None:
        """The child ``(model, gen)`` as it started (its port), until it is gone."""
        return None if self._is_gone((model, gen)) else self._known.get((model, gen))

    def accepts(self, model: str, gen: int) -> bool:
        """Whether a request (not ``final``) to the child ``(model, gen)`` would be sent:
        it is neither stopping nor gone."""
        return not self._is_stopped((model, gen))

    def forget(self, model: str, gen: int) -> None:
        """The child ``(model, gen)`` (and every older one of ``model``) is stopping or
        gone: close its connections now, idle or in use (an answer being read ends as a
        broken one); nothing but a ``final`` request is sent to it any more."""
        if gen > self._stopped.get(model, -1):
            self._stopped[model] = gen
        live = self._live.get(model)
        if live is not None and live.gen <= gen:
            del self._live[model]
        for key in [k for k in self._children if k[0] == model and k[1] <= gen]:
            state = self._children[key]
            for conn in state.idle:
                conn.close_now()
            state.open -= len(state.idle)
            state.idle.clear()
            for conn in state.busy:
                conn.close_now()  # its reader sees the connection break; checkin counts it
            if state.open <= 0:
                del self._children[key]

    def gone(self, model: str, gen: int) -> None:
        """The child ``(model, gen)`` (and every older one) exited: its port may be the
        next child's, so nothing at all is sent to it any more (`Gone`)."""
        self.forget(model, gen)
        if gen > self._gone.get(model, -1):
            self._gone[model] = gen
        for key in [k for k in self._known if k[0] == model and k[1] <= gen]:
            del self._known[key]
            for watcher in list(self._watchers):
                try:
                    watcher.child_gone(*key)
                except Exception:  # a watcher's bug must not take the transport down
                    log.exception("a watcher of %s's child failed", model)

    def _is_stopped(self, key: _Key) -> bool:
        return self._closed or key[1] <= self._stopped.get(key[0], -1)

    def _is_gone(self, key: _Key) -> bool:
        # (Not closed: at shutdown the relay's side closes before the children stop,
        # and each stop's KV save still goes, final, to its child.)
        return key[1] <= self._gone.get(key[0], -1)

    # ----- connections --------------------------------------------------------------------

    async def _checkout(self, key: _Key, port: int, final: bool = False) -> ChildConnection:
        """The most recently used idle connection, else a new one."""
        if self._is_gone(key) or (not final and self._is_stopped(key)):
            raise Gone("the model's server has exited")
        state = self._children.setdefault(key, _Child())
        while state.idle:
            conn = state.idle.pop()
            if not conn.peer_closed():
                break
            conn.close_now()  # closed by the child meanwhile: never carries a request
            state.open -= 1
        else:
            state.open += 1
            try:
                conn = await self._connect(port)
            except BaseException:
                state.open -= 1
                if state.open <= 0 and self._is_stopped(key):
                    self._children.pop(key, None)
                raise
        state.busy.add(conn)
        return conn

    def _checkin(self, key: _Key, conn: ChildConnection, reusable: bool) -> None:
        """An answer is over: its connection goes back to the pool, or is closed (a child
        that is gone, an answer cut short, one connection more than the child keeps)."""
        state = self._children.get(key)
        if state is not None:
            state.busy.discard(conn)
        keep = reusable and state is not None and not self._is_stopped(key)
        if keep and state is not None and state.open <= state.limit:
            state.idle.append(conn)
            return
        conn.close_now()
        if state is not None:
            state.open -= 1
            if state.open <= 0 and self._is_stopped(key):
                del self._children[key]

    async def _connect(self, port: int) -> ChildConnection:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setblocking(False)
        sock = trio.socket.from_stdlib_socket(raw)
        try:
            with trio.fail_after(self.connect_timeout):
                await sock.connect((self.host, port))
        except trio.TooSlowError:
            sock.close()
            raise Unreachable("Connection timeout") from None
        except OSError as exc:
            sock.close()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise Unreachable(f"Could not establish connection ({reason})") from None
        except BaseException:
            sock.close()
            raise
        stream = trio.SocketStream(sock)  # TCP_NODELAY set
        if self.tls is None:
            return ChildConnection(stream, raw, self.read_timeout)
        secure = trio.SSLStream(stream, self.tls, server_hostname=self.host)
        try:
            with trio.fail_after(self.connect_timeout):
                await secure.do_handshake()
        except (trio.TooSlowError, trio.BrokenResourceError) as exc:
            sock.close()
            cause = exc.__cause__ or exc
            raise Unreachable(f"TLS handshake with {self.host}:{port} failed: {cause}") from None
        except BaseException:
            sock.close()
            raise
        return ChildConnection(secure, raw, self.read_timeout)

    async def request(
        self,
        child: Child,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        *,
        final: bool = False,
    ) -> UpstreamResponse:
        """Send one request and wait for the answer's status and headers (``headers``
        without Content-Length: it is computed)."""
        wire = render_request(method, target, headers, body)
        return await self.send(child, wire, final=final)

    async def fetch(
        self,
        child: Child,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes = b"",
        *,
        final: bool = False,
    ) -> tuple[int, bytes]:
        """A small answer read whole: its status and decoded body. Raises
        `UpstreamError` (`Gone`: nothing sent); bound it with a cancel scope."""
        upstream = await self.request(child, method, target, headers, body, final=final)
        try:
            data = b"".join([chunk async for chunk in upstream.chunks()])
        finally:
            upstream.close()  # never blocks: back to the pool, or closed if unfinished
        return upstream.status_code, data

    async def send(self, child: Child, wire: bytes, *, final: bool = False) -> UpstreamResponse:
        """`request` with the request already rendered (`render_request`). ``final``:
        sent also to a child that is stopping (not to one gone), on a connection closed
        after the answer (the KV store's save before the exit command).

        A pooled connection the child closed in the meantime is mostly found before use;
        one that breaks before any answer is tried again on another connection only when
        the request cannot have reached the child, or is a GET or a HEAD (module
        docstring).
        """
        key = (child.model, child.gen)
        repeatable = wire.startswith(_REPEATABLE)
        while True:  # each stale pooled connection is closed, so this ends
            conn = await self._checkout(key, child.port, final)
            fresh = not conn.used
            try:
                return await self._exchange(key, conn, wire)
            except Stale as exc:
                if fresh or (exc.reached and not repeatable):
                    raise UpstreamError(str(exc)) from None

    async def _exchange(self, key: _Key, conn: ChildConnection, wire: bytes) -> UpstreamResponse:
        conn.used = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                # One write without a pass through the scheduler; it also tells whether
                # any byte left (a connection already reset fails here, with none sent).
                sent = 0 if conn.tls else conn.raw.send(wire)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise Stale(f"connection to the child failed: {exc}", reached=False) from None
            if sent < len(wire):
                try:
                    await conn.stream.send_all(memoryview(wire)[sent:])
                except (trio.BrokenResourceError, OSError) as exc:
                    message = f"connection to the child failed: {exc}"
                    raise Stale(message, reached=sent > 0) from None
            first = await conn.read_head()
            return UpstreamResponse(conn, first, lambda done, ok: self._checkin(key, done, ok))
        except BaseException:
            self._checkin(key, conn, reusable=False)
            raise

    async def aclose(self) -> None:
        """Idle connections closed, and no request sent any more but a ``final`` one to a
        child not yet gone (the KV saves of the stops that follow at shutdown)."""
        self._closed = True
        children, self._children = self._children, {}
        for state in children.values():
            for conn in state.idle:
                conn.close_now()
        await trio.lowlevel.checkpoint()
