"""One client connection: requests read in order, each answered before the next.

Keep-alive and pipelining: requests that arrive together are parsed together and
answered in order; while one is answered, a watcher reads ahead (bounded) so a
client that goes away is noticed at once. Timeouts: a keep-alive connection may sit
idle ``keep_alive_timeout``; a request's head must be complete ``head_timeout``
after its first byte, empty lines before it included (slowloris gets 408); a body
may pause ``read_timeout``, must be complete ``body_timeout`` after its head, and
must keep ``body_min_rate`` bytes a second once ``body_rate_grace`` is over (408).
While it holds no request being served (idle, silent since it opened, its head still
incomplete) a connection rests in the server's `resting`: at a cap, the server may
reclaim it for a new connection, and it ends at once, unanswered. Anything that
cannot be parsed gets an upstream-shaped JSON error and the close. The handler's
``admit`` decides at the head: a refused request with a body is answered and the
connection closed before its body is read or ``100 Continue`` goes out, so a client
without a key costs nothing.
"""

from __future__ import annotations

import logging
import math
import socket
from contextlib import suppress
from typing import TYPE_CHECKING, Protocol

import trio

from troupe.api import dumps
from troupe.http.server.exchange import ClientGone, Exchange, status_line
from troupe.http.server.parse import BadRequest, Refusal, Refused, Request, RequestParser

if TYPE_CHECKING:
    from troupe.http.server.lifecycle import HttpServer

__all__ = ["Connection", "Handler"]

log = logging.getLogger("troupe.http")

READ_SIZE = 65536
LINGER = 1.0  # seconds to drain what a refused client still sends, so it reads our answer
LINGER_BYTES = 16 << 20
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Handler(Protocol):
    def base_head(self, request: Request) -> bytes:
        """Header lines for every response to ``request`` (Server, CORS)."""
        ...

    def admit(self, request: Request) -> Refusal | None:
        """Decide at the head (no body read yet): a refusal, or None to serve it."""
        ...

    async def serve(self, exchange: Exchange) -> None: ...

    def refused(
        self, request: Request | None, status: int, message: str, body: bytes, peer: str
    ) -> None:
        """A request answered by the server itself (a refusal at the head, a parse error,
        a timeout, a body over the limit) before any handler ran: for the access log.
        ``request`` is None when not even a head could be read; ``body``: a refusal's."""
        ...

    async def upgrade(self, exchange: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        """A WebSocket upgrade: ``stream`` from here on, ``rest`` already read past the
        request's head."""
        ...


def error_bytes(status: int, message: str, base: bytes = b"Server: llama.cpp\r\n") -> bytes:
    """A whole JSON error response (upstream's shape) that closes the connection."""
    body = dumps({"error": {"code": status, "message": message, "type": "invalid_request_error"}})
    return b"".join(
        (
            status_line(status),
            b"Content-Type: application/json; charset=utf-8\r\n",
            base,
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body),
            body,
        )
    )


def refusal_bytes(refusal: Refusal, base: bytes) -> bytes:
    """A whole response for a refusal decided at the head, closing the connection."""
    return b"".join(
        (
            status_line(refusal.status),
            b"Content-Type: application/json; charset=utf-8\r\n",
            refusal.fields,
            base,
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(refusal.body),
            refusal.body,
        )
    )


_FULL = Refusal(503, dumps({"error": {"code": 503, "message": "too many open connections",
                                       "type": "unavailable_error"}}))  # fmt: skip


def _health_only(request: Request) -> Refusal | None:
    """Admission on a connection past the cap: a health probe (without a body), or
    the 503."""
    if (
        request.method in ("GET", "HEAD")
        and request.path.endswith("/health")
        and not request.has_body
    ):
        return None
    return _FULL


def _with_raw_socket(stream: trio.SocketStream) -> tuple[trio.SocketStream, socket.socket]:
    """The same connection, with the stdlib socket under it kept at hand (trio does
    not expose it) for writes that need no pass through the scheduler."""
    sock = stream.socket
    raw = socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    raw.setblocking(False)
    return trio.SocketStream(trio.socket.from_stdlib_socket(raw)), raw


def _peer_of(raw: socket.socket | None) -> str:
    if raw is None:
        return "-"  # TLS: not worth digging out of the SSL stream
    try:
        name = raw.getpeername()
    except OSError:
        return "-"
    if isinstance(name, tuple):
        host, port = name[0], name[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return "unix"


class Connection:
    def __init__(
        self,
        server: HttpServer,
        stream: trio.abc.Stream,
        *,
        reserve: bool = False,
        client: str = "",
    ) -> None:
        self.server = server
        self.reserve = reserve  # opened past --max-connections: GET /health only, once
        self.client = client  # the address counted against the cap per client ("": none)
        # In the server's `resting` (no request being served: it may be reclaimed), and
        # reclaimed (closed to make room for a new connection: it ends, unanswered).
        self.resting = False
        self.reclaimed = False
        # Set while a head (a TLS handshake, a body) arrives: a reclaim cancels it.
        self.head_scope: trio.CancelScope | None = None
        self.raw: socket.socket | None = None  # the plain socket under a SocketStream
        if isinstance(stream, trio.SocketStream):
            stream, self.raw = _with_raw_socket(stream)
        self.stream = stream
        admit = _health_only if reserve else server.handler.admit
        self.parser = RequestParser(server.config.max_body, admit)
        self.read_ahead: list[bytes] = []  # bytes received, not yet parsed
        self.read_ahead_size = 0
        self.eof = False
        self.drained = False  # the last read took all the socket had
        self.broken = False
        self.idle_scope: trio.CancelScope | None = None  # set while between requests
        self.request_scope: trio.CancelScope | None = None  # set while a request runs
        self._peer: str | None = None

    @property
    def peer(self) -> str:
        """The client's address (``host:port``; ``unix`` on a UNIX socket), read once."""
        if self._peer is None:
            self._peer = _peer_of(self.raw)
        return self._peer

    async def run(self) -> None:
        try:
            await self._loop()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ClientGone, OSError):
            pass  # the client went away; nothing to answer
        finally:
            await trio.aclose_forcefully(self.stream)

    def cancel_idle(self) -> None:
        if self.idle_scope is not None:
            self.idle_scope.cancel()

    def cancel_request(self) -> None:
        if self.request_scope is not None:
            self.request_scope.cancel()

    def reclaim(self) -> None:
        """Close to make room (it serves nothing): whatever it waits for ends now."""
        self.reclaimed = True
        if self.idle_scope is not None:
            self.idle_scope.cancel()
        if self.head_scope is not None:
            self.head_scope.cancel()

    async def _loop(self) -> None:
        server = self.server
        if isinstance(self.stream, trio.SSLStream):
            server.rest(self)
            with trio.move_on_after(server.config.head_timeout) as handshake:
                self.head_scope = handshake
                await self.stream.do_handshake()
            self.head_scope = None
            if handshake.cancelled_caught or self.reclaimed:
                return
        while True:
            request = await self._next_request()
            if request is None:
                return
            rest = self.parser.upgraded_rest
            if request.upgrade and rest is not None:
                await self._upgrade(request, rest)
                return
            if not await self._serve(request) or server.draining or self.reserve:
                return

    # -- reading -----------------------------------------------------------------------

    async def _receive(self) -> bytes:
        if self.read_ahead:
            data = b"".join(self.read_ahead)
            self.read_ahead.clear()
            self.read_ahead_size = 0
            return data
        if self.eof:
            return b""
        raw = self.raw
        data = b""
        if self.drained and raw is not None:
            # The last read took all there was (a client waiting for its answer sends
            # nothing more): wait until readable, then read at once, rather than a read
            # that fails first and a second pass through the scheduler.
            await trio.lowlevel.wait_readable(raw)
            try:
                data = raw.recv(READ_SIZE)
            except BlockingIOError:
                data = bytes(await self.stream.receive_some(READ_SIZE))
        else:
            data = bytes(await self.stream.receive_some(READ_SIZE))
        self.drained = len(data) < READ_SIZE
        return data

    async def _next_request(self) -> Request | None:
        parser = self.parser
        config = self.server.config
        # From the first byte of a head (an empty line before it counts: RFC 9112 2.2
        # lets a server skip them, not wait for them forever) to its end.
        head_deadline: float | None = None
        body_deadline: float | None = None
        body_start = 0.0
        continued = False
        while True:
            if parser.ready:
                if self.resting:
                    self.server.busy(self)
                return parser.ready.popleft()
            current = parser.current
            if current is not None and parser.head_done:
                head_deadline = None
                if self.resting:
                    self.server.busy(self)
                if body_deadline is None:
                    body_start = trio.current_time()
                    body_deadline = body_start + config.body_timeout
                if current.too_large:
                    limit = current.max_body
                    msg = f"request body is larger than the limit of {limit} bytes"
                    await self._refuse(
                        413, msg, self.server.handler.base_head(current), None, current
                    )
                    return None
                if current.expect_continue and not continued and current.refusal is None:
                    continued = True
                    await self.stream.send_all(_CONTINUE)
            elif current is not None and head_deadline is None:
                head_deadline = trio.current_time() + config.head_timeout
                if not self.resting:
                    self.server.rest(self)  # a head begun: reclaimable until complete
            if current is None and not self.read_ahead and head_deadline is None:
                # Between requests: the drain may close an idle connection right here.
                if self.eof or self.server.draining:
                    return None
                if not self.resting:
                    self.server.rest(self)
                # (deadline given to the constructor: setting it later costs more)
                with trio.CancelScope(
                    deadline=trio.current_time() + config.keep_alive_timeout
                ) as idle:
                    self.idle_scope = idle
                    data = await self._receive()
                self.idle_scope = None
                if idle.cancelled_caught or not data or self.reclaimed:
                    return None
                head_deadline = trio.current_time() + config.head_timeout
            else:
                slow = False  # the body's pace is the nearest deadline
                if head_deadline is not None:
                    deadline = head_deadline
                else:
                    deadline = trio.current_time() + config.read_timeout
                    if body_deadline is not None:
                        deadline = min(deadline, body_deadline)
                        pace = self._pace_deadline(body_start)
                        if pace < deadline:
                            deadline, slow = pace, True
                with trio.move_on_at(deadline) as waited:
                    self.head_scope = waited
                    data = await self._receive()
                self.head_scope = None
                if self.reclaimed:
                    return None
                if waited.cancelled_caught:
                    if slow:
                        rate, grace = config.body_min_rate, config.body_rate_grace
                        msg = f"request body too slow (under {rate} bytes/s after {grace:g} s)"
                        await self._refuse(408, msg)
                    else:
                        await self._refuse(408, "timed out reading the request")
                    return None
                if not data:
                    return None  # the client closed mid-request
            try:
                parser.feed(data)
            except Refused as refused:
                handler = self.server.handler
                base = handler.base_head(refused.request)
                refusal = refused.refusal
                await self._refuse(refusal.status, "", base, refusal, refused.request)
                return None
            except BadRequest as exc:
                await self._refuse(exc.status, exc.message)
                return None

    def _pace_deadline(self, body_start: float) -> float:
        """When the body falls behind its minimum rate (mod_reqtimeout's MinRate): the
        grace after its head, and one second more per ``body_min_rate`` bytes in."""
        config = self.server.config
        current = self.parser.current
        if config.body_min_rate <= 0 or current is None:
            return math.inf
        return body_start + config.body_rate_grace + current.body_size / config.body_min_rate

    async def wait_for_eof(self) -> bool:
        """Read ahead while a response is written; True once the client closed (or
        broke) the connection. Stops reading past ``max_read_ahead`` (backpressure)."""
        limit = self.server.config.max_read_ahead
        try:
            while self.read_ahead_size < limit:
                data = await self.stream.receive_some(READ_SIZE)
                if not data:
                    self.eof = True
                    return True
                self.read_ahead.append(bytes(data))
                self.read_ahead_size += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.eof = self.broken = True
            return True
        await trio.sleep_forever()
        raise AssertionError

    async def _refuse(
        self,
        status: int,
        message: str,
        base: bytes | None = None,
        refusal: Refusal | None = None,
        request: Request | None = None,
    ) -> None:
        """Answer an unacceptable request and close, draining what the client still
        sends for a moment (closing on unread bytes would reset the connection and
        lose the answer; what is drained is dropped, never parsed or kept)."""
        self.server.handler.refused(
            request or self.parser.current,
            status,
            message,
            refusal.body if refusal is not None else b"",
            self.peer,
        )
        if refusal is not None:
            data = refusal_bytes(refusal, base or b"")
        else:
            log.info("refused a request: %d %s", status, message)
            data = error_bytes(status, message, base) if base else error_bytes(status, message)
        with trio.move_on_after(self.server.config.head_timeout):
            await self.stream.send_all(data)
        if isinstance(self.stream, trio.SocketStream) and not self.eof:
            with trio.move_on_after(LINGER):
                await self.stream.send_eof()
                drained = 0
                while drained < LINGER_BYTES:
                    chunk = await self.stream.receive_some(READ_SIZE)
                    if not chunk:
                        break
                    drained += len(chunk)

    # -- answering ---------------------------------------------------------------------

    async def _serve(self, request: Request) -> bool:
        """Run the handler for ``request``; True if the connection may carry another."""
        server = self.server
        exchange = Exchange(self, request, server.handler.base_head(request))
        server.request_started()
        try:
            with trio.CancelScope() as scope:
                self.request_scope = scope
                if server.stopping:
                    scope.cancel()
                try:
                    refusal = request.refusal
                    if refusal is None:
                        await server.handler.serve(exchange)
                    else:
                        server.handler.refused(request, refusal.status, "", refusal.body, self.peer)
                        await exchange.respond_refusal(refusal)
                except ClientGone:
                    pass
                except Exception:
                    log.exception("error answering %s %s", request.method, request.path)
                    exchange.keep_alive = False
                    if not exchange.started:
                        await self._safe_respond(exchange, 500, "internal error")
            self.request_scope = None
            if not exchange.started and not self.broken and not self.eof:
                # Cancelled by a hard stop before it could answer.
                exchange.keep_alive = False
                await self._safe_respond(exchange, 503, "the router is shutting down")
        finally:
            server.request_finished()
        return exchange.keep_alive and not self.broken

    async def _safe_respond(self, exchange: Exchange, status: int, message: str) -> None:
        body = dumps({"error": {"code": status, "message": message, "type": "server_error"}})
        with trio.CancelScope(shield=True), trio.move_on_after(1.0), suppress(ClientGone):
            await exchange.respond(status, body)

    async def _upgrade(self, request: Request, rest: bytes) -> None:
        server = self.server
        exchange = Exchange(self, request, server.handler.base_head(request))
        server.request_started()
        try:
            with trio.CancelScope() as scope:
                self.request_scope = scope
                await server.handler.upgrade(exchange, self.stream, rest)
            self.request_scope = None
        finally:
            server.request_finished()
