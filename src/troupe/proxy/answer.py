"""One keep-alive connection to a child and the answer read off it (llhttp).

The answer's head is parsed; its body is handed over either as the bytes that came
off the wire (`UpstreamResponse.receive_raw`, chunk framing included, for the byte
relay) or decoded (`UpstreamResponse.chunks`, for small answers the router reads
itself). The C parser only watches the bytes go by, to know where the answer ends.
"""

from __future__ import annotations

import math
import socket
from collections.abc import AsyncIterator, Callable

import httptools
import trio

__all__ = ["Broken", "ChildConnection", "Stale", "UpstreamError", "UpstreamResponse"]

READ_SIZE = 65536
MAX_HEAD = 64 << 10  # a child's response head is a few hundred bytes


class UpstreamError(Exception):
    """The child could not be reached, or broke the connection."""


class ChildConnection:
    """One keep-alive connection and the llhttp parser that follows its answers.

    The parser's callbacks land here (httptools calls methods of the object it was
    given); only the ones the relay needs exist, so llhttp calls nothing else."""

    __slots__ = (
        "body_bytes",
        "chunk_open",
        "chunked",
        "collect",
        "content_type",
        "decoded",
        "done",
        "drained",
        "has_length",
        "head_done",
        "headers",
        "keep_alive",
        "parser",
        "raw",
        "read_timeout",
        "stream",
        "tls",
        "used",
    )

    def __init__(
        self,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        raw: socket.socket,
        read_timeout: float | None,
    ) -> None:
        self.stream = stream
        self.raw = raw  # the same socket, for a read right after it became readable
        # TLS (a cluster node over https): every byte goes through the SSLStream, never
        # the raw socket.
        self.tls = isinstance(stream, trio.SSLStream)
        self.read_timeout = read_timeout  # longest silence from the child (--timeout)
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.done = False
        self.keep_alive = True
        # Read off the head once, in `on_headers_complete` (the relay asks for each).
        self.chunked = False  # Transfer-Encoding: chunked
        self.has_length = False  # a Content-Length field
        self.content_type: bytes | None = None
        self.chunk_open = False
        self.collect = False  # keep decoded body pieces (chunks()), else just follow
        self.decoded: list[bytes] = []
        self.body_bytes = 0  # the answer's body read so far, chunk framing left out
        self.drained = False  # the last read took all there was
        self.used = False  # carried a request already (a pooled one may have gone stale)

    # -- llhttp callbacks
    def on_message_begin(self) -> None:
        self.headers = []
        self.head_done = self.done = False
        self.body_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        chunked = has_length = False
        content_type = None
        for key, value in self.headers:
            lowered = key.lower()
            if lowered == b"content-type":
                if content_type is None:
                    content_type = value
            elif lowered == b"content-length":
                has_length = True
            elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        self.chunked, self.has_length, self.content_type = chunked, has_length, content_type
        # llama-server (cpp-httplib) closes the connection right after a chunked answer
        # (a stream) although it says keep-alive: measured, its FIN follows the last
        # chunk at once. Pooled, the connection would race that close (the next request
        # sent into it is lost, and a POST cannot go again), so it is not kept.
        self.keep_alive = not chunked and self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.collect:
            self.decoded.append(body)

    def on_message_complete(self) -> None:
        self.done = True

    def on_chunk_header(self) -> None:
        self.chunk_open = True

    def on_chunk_complete(self) -> None:
        self.chunk_open = False

    # --
    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise UpstreamError(f"the child sent an invalid answer: {exc}") from None

    async def receive(self) -> bytes:
        with trio.move_on_after(self.read_timeout or math.inf) as scope:
            return await self._receive()
        assert scope.cancelled_caught
        raise UpstreamError("Read timeout")

    async def _receive(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(READ_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise Broken(f"connection to the child broke: {exc}") from exc

    async def _receive_when_readable(self) -> bytes:
        """A read that first waits for the socket to be readable: right after a request
        went out the child has not answered yet, so a read tried first would only fail
        (a syscall and an exception) before the same wait."""
        if self.tls:  # (and `drained` stays False: receive_raw must not read the socket)
            return await self._receive()
        raw = self.raw
        try:
            await trio.lowlevel.wait_readable(raw)
            try:
                data = raw.recv(READ_SIZE)
            except BlockingIOError:
                data = bytes(await self.stream.receive_some(READ_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise Broken(f"connection to the child broke: {exc}") from exc
        self.drained = len(data) < READ_SIZE
        return data

    async def read_head(self) -> bytes:
        """Read up to the end of a final (not 1xx) answer's head; returns the body bytes
        that came with it. Raises `Stale` if the child closed before answering. One
        deadline for the whole head (the time to first byte is the long part)."""
        with trio.move_on_after(self.read_timeout or math.inf) as scope:
            return await self._read_head()
        assert scope.cancelled_caught
        raise UpstreamError("Read timeout")

    async def _read_head(self) -> bytes:
        buf = b""
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    raise UpstreamError("the child's answer head is too large")
                try:
                    data = await self._receive_when_readable()
                except Broken as exc:
                    if buf:
                        raise
                    raise Stale(str(exc)) from None  # a pooled connection reset: retry
                if not data:
                    if buf:
                        raise UpstreamError("the child closed the connection mid-answer")
                    raise Stale("the child closed the connection without answering")
                buf += data
                continue
            head, buf = buf[: end + 4], buf[end + 4 :]
            self.feed(head)
            if not 100 <= self.parser.get_status_code() < 200:
                return buf
            # an interim answer (100 Continue): the real one follows

    def close_now(self) -> None:
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            stream.transport_stream.socket.close()
        else:
            stream.socket.close()

    def peer_closed(self) -> bool:
        """Whether an idle connection is unusable, found without blocking: the child
        closed it (EOF), reset it, or sent bytes nobody asked for. Checked before a
        pooled connection carries a request, so a request is rarely sent into one the
        child has already closed (its keep-alive timeout, or after a stream)."""
        try:
            self.raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # open, nothing to read: as an idle connection should be
        except OSError:
            return True
        return True

    @property
    def reusable(self) -> bool:
        return self.done and self.keep_alive


class UpstreamResponse:
    """Status and headers of a child's answer; the body is read with `receive_raw`
    (wire bytes) or `chunks` (decoded), not both."""

    def __init__(
        self, conn: ChildConnection, first: bytes, pool: Callable[[ChildConnection, bool], None]
    ) -> None:
        self._pool = pool  # takes the connection back: to reuse (True) or to close
        self._conn: ChildConnection | None = conn
        self.status_code: int = conn.parser.get_status_code()
        self.headers: list[tuple[bytes, bytes]] = conn.headers
        self._first = first  # body bytes that arrived with the head, not yet handed out
        self.read_timeout = conn.read_timeout
        self.chunked = conn.chunked  # Transfer-Encoding: chunked
        self.content_type = conn.content_type  # the Content-Type field, if any
        # No length and not chunked: the body runs until the child closes (RFC 9112 6.3).
        self._until_close = not conn.done and not conn.chunked and not conn.has_length
        self._body_bytes = 0  # (kept at close: the connection may carry another answer)
        self._aborted = False  # `abort`: the answer was cut, where its framing then stood
        self._cut_mid_chunk = False

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    @property
    def body_bytes(self) -> int:
        """The body bytes read so far, chunk framing left out (what the access record
        counts, whether a relay passed the framing on or framed the body anew)."""
        return self._conn.body_bytes if self._conn is not None else self._body_bytes

    @property
    def complete(self) -> bool:
        """The whole answer has been read."""
        if self._conn is None:
            return not self._aborted
        return self._conn.done

    @property
    def mid_chunk(self) -> bool:
        """The bytes read so far end inside a chunk (a relay must not cut there)."""
        if self._conn is None:
            return self._cut_mid_chunk
        return self._conn.chunk_open

    def take_first(self) -> bytes:
        """The body bytes that arrived with the head (maybe none), as `receive_raw`
        would return them, without waiting."""
        data, self._first = self._first, b""
        if data and self._conn is not None:
            self._conn.feed(data)
        return data

    async def receive_raw(self) -> bytes:
        """The next bytes of the body as they came off the wire (chunk framing
        included); b"" once the answer is complete. No read timeout here: the caller
        bounds the whole relay (one cancel scope, cheaper than one per read)."""
        conn = self._conn
        if conn is None:
            if self._aborted:
                raise UpstreamError("the answer was cut: its node stopped answering")
            return b""
        if self._first:
            data, self._first = self._first, b""
            conn.feed(data)
            return data
        if conn.done:
            return b""
        try:
            if conn.drained and not conn.tls:  # (TLS: every byte through the SSLStream)
                # The last read emptied the socket: wait until it is readable, then read
                # at once (no read that fails first, no second pass through the
                # scheduler: one wake-up and one syscall per event).
                await trio.lowlevel.wait_readable(conn.raw)
                try:
                    data = conn.raw.recv(READ_SIZE)
                except BlockingIOError:
                    data = bytes(await conn.stream.receive_some(READ_SIZE))
            else:
                # (bytes() of bytes is the same object; an SSLStream's may be a bytearray)
                data = bytes(await conn.stream.receive_some(READ_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamError(f"connection to the child broke: {exc}") from exc
        if not data:
            return self._eof()
        conn.drained = len(data) < READ_SIZE
        conn.feed(data)
        return data

    def _eof(self) -> bytes:
        """The child closed: the end of an answer delimited by the close, else a break."""
        if self._until_close and self._conn is not None:
            self._conn.done = True
            self._conn.keep_alive = False
            return b""
        raise UpstreamError("the child closed the connection mid-response")

    def chunks(self) -> AsyncIterator[bytes]:
        """The decoded body as it arrives. Not an async generator (none is left for
        the garbage collector when a client disconnects midway)."""
        if self._conn is not None:
            self._conn.collect = True
        return _Chunks(self)

    async def _next_decoded(self) -> bytes | None:
        conn = self._conn
        if conn is None:
            if self._aborted:
                raise UpstreamError("the answer was cut: its node stopped answering")
            return None
        if self._first:
            data, self._first = self._first, b""
            conn.feed(data)
        elif conn.done:
            return None
        else:
            data = await conn.receive()
            if not data:
                self._eof()
                return None
            conn.feed(data)
        out = b"".join(conn.decoded)
        conn.decoded.clear()
        return out

    def abort(self) -> None:
        """Ends a read of this answer under way, from another task: the connection is
        closed under it, so the reader gets the `UpstreamError` of a broken connection
        (a relay then ends as for a child lost: an SSE client gets an error event at a
        chunk boundary). For a node that stopped answering in the middle of its answer."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._body_bytes = conn.body_bytes
        self._aborted, self._cut_mid_chunk = True, conn.chunk_open
        conn.keep_alive = False
        self._pool(conn, False)  # closed: a read waiting on it wakes with the break

    async def aclose(self) -> None:
        """`close`, as a checkpoint."""
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Done with this answer: a fully read keep-alive connection goes back to the
        pool; anything else is closed, which tells the child to stop. Never blocks."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._body_bytes = conn.body_bytes
        conn.collect = False
        conn.decoded.clear()
        self._pool(conn, conn.reusable and not self._first)  # closed unless reusable


class _Chunks:
    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        while True:
            chunk = await self._response._next_decoded()
            if chunk is None:
                raise StopAsyncIteration
            if chunk:
                return chunk


class Stale(Exception):
    """The child closed or reset a connection before answering. ``reached``: some of
    the request was written, so the child may have read it and acted on it."""

    def __init__(self, message: str, *, reached: bool = True) -> None:
        super().__init__(message)
        self.reached = reached


class Broken(UpstreamError):
    pass
