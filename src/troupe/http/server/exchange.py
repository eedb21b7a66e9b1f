"""`Exchange`: one request and the means to answer it, as handlers see it.

A response is written as bytes: `respond` for a whole one (head and body in one
write), or `head` then `send` for a stream. Every head carries the connection's
base fields (``Server: llama.cpp`` and the CORS header, as llama-server sets them) and says
whether the connection stays open. Streams are chunked unless the client speaks
HTTP/1.0 (then the body runs to the close).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import trio

from troupe.api import JSON_TYPE
from troupe.http.server.parse import Refusal, Request
from troupe.http.server.watch import WATCH_AFTER, Watched

if TYPE_CHECKING:
    from troupe.http.server.connection import Connection

__all__ = ["ClientGone", "Exchange", "status_line"]

_STATUS_LINES = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("latin-1") for s in HTTPStatus
}
_JSON_TYPE = JSON_TYPE.encode("latin-1")


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d Unknown\r\n" % status


class ClientGone(Exception):
    """The client's connection broke while we were writing to it."""


class Exchange:
    __slots__ = (
        "_conn",
        "_head_left",
        "_params",
        "base",
        "framing",
        "keep_alive",
        "request",
        "sent",
        "started",
        "status",
    )

    def __init__(self, conn: Connection, request: Request, base: bytes) -> None:
        self._conn = conn
        self.request = request
        self.base = base  # header lines every response carries
        self.keep_alive = request.keep_alive
        self.framing = False  # the body goes out in chunks we frame
        self.started = False  # a head has been sent
        self.status = 0
        self.sent = 0  # body bytes written (for metrics and logs)
        self._params: dict[str, str] | None = None
        self._head_left = -1  # HEAD: bytes of the head still to write, then nothing

    # -- the request ---------------------------------------------------------------------

    @property
    def method(self) -> str:
        return self.request.method

    @property
    def path(self) -> str:
        return self.request.path

    @property
    def target(self) -> bytes:
        """Path and query as the client sent them (percent-encoded)."""
        return self.request.target

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return self.request.headers

    @property
    def body(self) -> bytes:
        return self.request.body

    def header(self, name: bytes) -> str | None:
        return self.request.header(name)

    @property
    def params(self) -> dict[str, str]:
        """Decoded query parameters; a repeated key keeps its first value (httplib)."""
        if self._params is None:
            out: dict[str, str] = {}
            for key, value in parse_qsl(self.request.query.decode("latin-1"), True):
                out.setdefault(key, value)
            self._params = out
        return self._params

    @property
    def client(self) -> str:
        """The client's address, for the access log."""
        return self._conn.peer

    @property
    def server_stopping(self) -> bool:
        """The server is being stopped hard: streams should end with a last word."""
        return self._conn.server.stopping

    # -- the response ----------------------------------------------------------------------

    def head(self, status: int, fields: bytes, *, length: int | None) -> bytes:
        """Status line, ``fields`` (complete lines), ours, the framing, the blank line.
        ``length`` None: a stream (chunked for HTTP/1.1 clients)."""
        self.started = True
        self.status = status
        if self._conn.server.draining:
            self.keep_alive = False
        if length is not None:
            framing = b"Content-Length: %d\r\n" % length
        elif self.request.http_version == "1.1":
            self.framing = True
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            self.keep_alive = False  # an HTTP/1.0 stream ends with the connection
            framing = b""
        connection = b"" if self.keep_alive else b"Connection: close\r\n"
        head = b"".join((status_line(status), fields, self.base, framing, connection, b"\r\n"))
        if self.request.head_only:
            self._head_left = len(head)
        return head

    def chunk(self, data: bytes) -> bytes:
        """``data`` framed as one chunk of a stream (as is when not framing)."""
        if not self.framing or not data:
            return data
        return b"%x\r\n%b\r\n" % (len(data), data)

    @property
    def last_chunk(self) -> bytes:
        return b"0\r\n\r\n" if self.framing else b""

    async def send(self, data: bytes) -> None:
        """Write bytes to the client; `ClientGone` if it went away. What the socket
        takes at once is written without a pass through the scheduler (the relay's
        loop already waits once per read); the rest waits for the client."""
        conn = self._conn
        if self._head_left >= 0:  # HEAD: the head goes out, the body does not
            data, self._head_left = data[: self._head_left], max(0, self._head_left - len(data))
            if not data:
                return
        try:
            raw = conn.raw
            if raw is not None:
                try:
                    sent = raw.send(data)
                except BlockingIOError:
                    sent = 0
                if sent == len(data):
                    return
                data = data[sent:]
            await conn.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.keep_alive = False
            self._conn.broken = True
            raise ClientGone(str(exc)) from None

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: str | bytes = _JSON_TYPE,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        """A whole response in one write."""
        ctype = content_type if isinstance(content_type, bytes) else content_type.encode()
        fields = b"Content-Type: " + ctype + b"\r\n"
        for key, value in headers:
            fields += key + b": " + value + b"\r\n"
        head = self.head(status, fields, length=len(body))
        if self.request.head_only:
            await self.send(head)  # the length of what a GET would get, and no body
            return
        self.sent += len(body)
        await self.send(head + body)

    async def respond_refusal(self, refusal: Refusal) -> None:
        """A refusal decided at the head, for a request without a body (keep-alive)."""
        fields = b"Content-Type: " + _JSON_TYPE + b"\r\n" + refusal.fields
        head = self.head(refusal.status, fields, length=len(refusal.body))
        self.sent += len(refusal.body)
        await self.send(head + refusal.body)  # (HEAD: send drops the body)

    async def until_client_leaves(self, work: Callable[[], Awaitable[None]]) -> bool:
        """Run ``work`` until it ends or the client disconnects (which cancels it, so a
        waiting request leaves the queue and a relay stops its child at once). Returns
        True when the client left. Bytes of a next, pipelined request are kept.

        The client is watched only once ``work`` has run `WATCH_AFTER`, by the server's
        `ClientWatch` (no task of its own per request)."""
        conn = self._conn
        watch = conn.server.watch
        if watch.nursery is None:  # a server not serving (yet): a watcher of its own
            return await self._until_client_leaves_alone(work)
        gone = False
        with trio.CancelScope() as scope:
            watched = Watched(conn, scope)
            watch.add(watched, trio.current_time())
            try:
                await work()
            except* ClientGone:
                # A write found the client gone (before the watch did), maybe from
                # inside the app's own nursery: caught here, whole or in a group.
                gone = True
            finally:
                await watch.end(watched)
        if watched.gone:
            gone = True
            self.keep_alive = False
        return gone

    async def _until_client_leaves_alone(self, work: Callable[[], Awaitable[None]]) -> bool:
        conn = self._conn
        gone = False
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal gone
                await trio.sleep(WATCH_AFTER)
                if await conn.wait_for_eof():
                    gone = True
                    self.keep_alive = False
                    nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            try:
                await work()
            except* ClientGone:
                gone = True
            nursery.cancel_scope.cancel()
        return gone
