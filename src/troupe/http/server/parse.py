"""Requests off the wire: llhttp (httptools) feeds `Request` objects, limits enforced.

One parser per connection, fed whatever the socket gives; completed requests queue
up in order (pipelining), and the connection only reads more once the queue is
empty, so the queue stays short. Limits are llama-server's httplib's where it has
them: 8 KiB of request target (414), 100 header fields and 64 KiB of head (431);
a declared body over ``--max-body-mib`` is refused (413) as soon as its head is in.
"""

from __future__ import annotations

from collections import deque
from urllib.parse import unquote

import httptools

__all__ = ["BadRequest", "Request", "RequestParser"]

MAX_TARGET = 8192
MAX_HEADERS = 100
MAX_HEAD = 64 << 10


class BadRequest(Exception):
    """The bytes are not an acceptable request: answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Request:
    """One parsed request: method, target, lower-case header names, the whole body."""

    __slots__ = (
        "body",
        "body_size",
        "chunked",
        "content_length",
        "expect_continue",
        "headers",
        "http_version",
        "keep_alive",
        "method",
        "path",
        "query",
        "target",
        "too_large",
        "upgrade",
    )

    def __init__(self) -> None:
        self.method = ""
        self.target = b""  # as sent: path and query, percent-encoded
        self.path = ""  # percent-decoded, without the query
        self.query = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.http_version = "1.1"
        self.keep_alive = True
        self.content_length = -1  # -1: none declared
        self.chunked = False
        self.expect_continue = False
        self.upgrade = False  # Upgrade: websocket
        self.body = b""
        self.body_size = 0
        self.too_large = False

    def header(self, name: bytes) -> str | None:
        """The first value of header ``name`` (lower-case), decoded as latin-1."""
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None


class RequestParser:
    """Feeds one connection's bytes to llhttp; `ready` holds the requests completed."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.ready: deque[Request] = deque()
        self.current: Request | None = None  # the request being parsed
        self.head_done = False  # the current request's head is complete
        self.upgraded_rest: bytes | None = None  # bytes after a WebSocket upgrade head
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body: list[bytes] = []
        self._head_bytes = 0

    @property
    def in_progress(self) -> bool:
        """Some bytes of a request not yet complete have arrived."""
        return self.current is not None

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises `BadRequest` for what cannot be answered in kind."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgraded(data, int(exc.args[0]))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, BadRequest):
                raise cause from None
            raise BadRequest(400, f"invalid request: {exc}") from None
        except httptools.HttpParserError as exc:
            raise BadRequest(400, f"invalid request: {_reason(exc)}") from None
        if self.current is not None and not self.head_done:
            # A head still incomplete: count what it may hold (a field without its end
            # of line never reaches on_header, so count bytes, not fields).
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                raise BadRequest(431, "request header fields too large")

    def _upgraded(self, data: bytes, offset: int) -> None:
        request = self.ready[-1] if self.ready else None
        if request is not None and request.upgrade:
            self.upgraded_rest = data[offset:]  # WebSocket frames: not HTTP any more
            return
        # Another protocol (h2c): ignored, the connection goes on as HTTP/1.1.
        self._parser = httptools.HttpRequestParser(self)
        if data[offset:]:
            self.feed(data[offset:])

    # -- llhttp callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = Request()
        self.head_done = False
        self._url = b""
        self._body = []
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_TARGET:
            raise BadRequest(414, "request target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.current
        assert request is not None
        if len(request.headers) >= MAX_HEADERS:
            raise BadRequest(431, "too many request header fields")
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD:
            raise BadRequest(431, "request header fields too large")
        request.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        request = self.current
        assert request is not None
        parser = self._parser
        request.method = parser.get_method().decode("ascii")
        request.http_version = parser.get_http_version()
        request.keep_alive = parser.should_keep_alive()
        target = self._url
        request.target = target
        path, _, query = target.partition(b"?")
        request.query = query
        request.path = unquote(path.decode("latin-1")) if b"%" in path else path.decode("latin-1")
        for key, value in request.headers:
            if key == b"content-length":
                request.content_length = int(value)  # llhttp checked it is a number
            elif key == b"transfer-encoding":
                request.chunked = b"chunked" in value.lower()
            elif key == b"expect":
                request.expect_continue = value.lower() == b"100-continue"
            elif key == b"upgrade":
                request.upgrade = value.lower() == b"websocket"
        if request.content_length > self.max_body:
            request.too_large = True
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        request = self.current
        assert request is not None
        request.body_size += len(body)
        if request.body_size > self.max_body:
            request.too_large = True
            self._body = []
        elif not request.too_large:
            self._body.append(body)

    def on_message_complete(self) -> None:
        request = self.current
        assert request is not None
        body = self._body
        request.body = body[0] if len(body) == 1 else b"".join(body)
        self._body = []
        self.current = None
        self.head_done = False
        self.ready.append(request)


def _reason(exc: Exception) -> str:
    text = str(exc)
    return text.removeprefix("invalid ").strip() or "malformed"
