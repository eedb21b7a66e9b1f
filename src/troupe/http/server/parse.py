"""Requests off the wire: llhttp (httptools) feeds `Request` objects, limits enforced.

One parser per connection, fed whatever the socket gives; completed requests queue
up in order (pipelining), and the connection only reads more once the queue is
empty, so the queue stays short. Limits are llama-server's httplib's where it has
them: 8 KiB of request target (414), 100 header fields and 64 KiB of head (431);
a declared body over ``--max-body-mib`` is refused (413) as soon as its head is in.

Decided at the head: once a head is complete, ``admit`` (the front's) settles the
request's fate before a byte of its body is parsed. A refusal of a request with a
body raises `Refused` (its body is never read; the connection answers and closes);
one without a body rides along as ``request.refusal`` and is answered in order.
RFC 9112's MUSTs: an HTTP/1.1 request without exactly one ``Host`` is a 400, an
HTTP/0.9 request line is a 400, an absolute-form target is taken (its authority
replaces ``Host``). Trailer fields are dropped: never headers, never forwarded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import attrs
import httptools

from troupe.api import dumps

__all__ = ["Admit", "BadRequest", "Refusal", "Refused", "Request", "RequestParser"]

MAX_TARGET = 8192
MAX_HEADERS = 100
MAX_HEAD = 64 << 10


class BadRequest(Exception):
    """The bytes are not an acceptable request: answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen
class Refusal:
    """An answer decided at the head: ``status``, a JSON ``body``, extra header lines."""

    status: int
    body: bytes
    fields: bytes = b""


class Refused(Exception):
    """A request with a body refused at its head: answer, close, never read the body."""

    def __init__(self, request: Request, refusal: Refusal) -> None:
        super().__init__(refusal.status)
        self.request = request
        self.refusal = refusal


class Request:
    """One parsed request: method, target, lower-case header names, the whole body."""

    __slots__ = (
        "authority",
        "body",
        "body_size",
        "chunked",
        "content_length",
        "expect_continue",
        "head_only",
        "headers",
        "http_version",
        "keep_alive",
        "key_name",
        "max_body",
        "method",
        "path",
        "query",
        "refusal",
        "route",
        "target",
        "too_large",
        "upgrade",
    )

    def __init__(self) -> None:
        self.method = ""
        self.target = b""  # origin-form as sent: path and query, percent-encoded
        self.authority = b""  # Host, or the authority of an absolute-form target
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
        self.max_body = 0  # the limit for this request's body (admit may lower it)
        self.refusal: Refusal | None = None  # decided at the head: answered, not served
        self.route: Any = None  # what admit found for the request (the front's handler)
        self.key_name = ""  # whose API key it carried, for logs
        self.head_only = False  # HEAD: answered as the GET would be, without the body

    @property
    def has_body(self) -> bool:
        return self.content_length > 0 or self.chunked

    def header(self, name: bytes) -> str | None:
        """The first value of header ``name`` (lower-case), decoded as latin-1."""
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None


# Settles a request once its head is in: a `Refusal`, or None to serve it (it may set
# ``request.route``, ``request.max_body`` and ``request.key_name`` for what follows).
Admit = Callable[[Request], Refusal | None]


def _too_large(limit: int) -> Refusal:
    message = f"request body is larger than the limit of {limit} bytes"
    return Refusal(413, _error_json(413, message))


def _error_json(status: int, message: str) -> bytes:
    return dumps({"error": {"code": status, "message": message, "type": "invalid_request_error"}})


class RequestParser:
    """Feeds one connection's bytes to llhttp; `ready` holds the requests completed."""

    def __init__(self, max_body: int, admit: Admit | None = None) -> None:
        self.max_body = max_body
        self.admit = admit
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
            if isinstance(cause, (BadRequest, Refused)):
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
        if not self._url and self._parser.get_method() == b"PRI":
            # HTTP/2's preface (prior knowledge): llhttp would wait for the rest of it
            # until the head deadline; troupe speaks HTTP/1.1 only, so say so now.
            raise BadRequest(400, "invalid request: HTTP/2 is not supported (HTTP/1.1 is)")
        self._url += url
        if len(self._url) > MAX_TARGET:
            raise BadRequest(414, "request target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.current
        assert request is not None
        if self.head_done:
            # A chunked body's trailer field: dropped (never a header, never used for
            # auth, never forwarded), only counted against the head's limit.
            self._head_bytes += len(name) + len(value) + 4
            if self._head_bytes > 2 * MAX_HEAD:
                raise BadRequest(431, "request trailer fields too large")
            return
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
        request.head_only = request.method == "HEAD"
        request.http_version = parser.get_http_version()
        request.keep_alive = parser.should_keep_alive()
        if request.http_version == "0.9":
            raise BadRequest(400, "invalid request: HTTP/0.9 is not supported")
        target = self._url
        hosts = 0
        codings: list[bytes] = []
        if target[:1] != b"/" and b"://" in target:
            target = self._absolute_form(request, target)
        request.target = target
        path, _, query = target.partition(b"?")
        request.query = query
        request.path = unquote(path.decode("latin-1")) if b"%" in path else path.decode("latin-1")
        for key, value in request.headers:
            if key == b"host":
                hosts += 1
                if not request.authority:
                    request.authority = value
            elif key == b"content-length":
                request.content_length = int(value)  # llhttp checked it is a number
            elif key == b"transfer-encoding":
                codings.append(value)
            elif key == b"expect":
                request.expect_continue = value.lower() == b"100-continue"
            elif key == b"upgrade":
                request.upgrade = value.lower() == b"websocket"
        if codings:
            request.chunked = _chunked_only(codings)
        if hosts > 1 or (not hosts and request.http_version == "1.1"):
            # RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without a
            # Host, and to any request with more than one.
            raise BadRequest(400, "invalid request: " + ("no Host" if not hosts else "two Host"))
        request.max_body = self.max_body
        self.head_done = True
        if self.admit is not None and not request.upgrade:
            refusal = self.admit(request)
            if refusal is not None:
                request.refusal = refusal
                if request.has_body:
                    raise Refused(request, refusal)
                return
        if request.content_length > request.max_body:
            raise Refused(request, _too_large(request.max_body))

    @staticmethod
    def _absolute_form(request: Request, target: bytes) -> bytes:
        """``http://host/path?q`` (RFC 9112 3.2.2): the authority replaces Host, the
        rest is the target; a scheme other than http(s) is a 400."""
        scheme, sep, rest = target.partition(b"://")
        if not sep or scheme.lower() not in (b"http", b"https"):
            raise BadRequest(400, "invalid request: request target")
        slash = len(rest)
        for mark in (b"/", b"?"):
            at = rest.find(mark)
            if 0 <= at < slash:
                slash = at
        authority, origin = rest[:slash], rest[slash:]
        if not authority or b"@" in authority:
            raise BadRequest(400, "invalid request: request target")
        request.authority = authority
        return origin if origin.startswith(b"/") else b"/" + origin

    def on_body(self, body: bytes) -> None:
        request = self.current
        assert request is not None
        request.body_size += len(body)
        if request.body_size > request.max_body:
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


def _chunked_only(fields: list[bytes]) -> bool:
    """Transfer-Encoding must say exactly ``chunked`` (RFC 9112 6.1: chunked not last is
    a 400; a coding troupe does not know SHOULD be a 501, a 400 here: the client's
    request is at fault, and a 5xx would read as troupe's), so no two readers can frame
    the body differently."""
    codings = [c.strip(b" \t").lower() for c in b",".join(fields).split(b",")]
    if codings == [b"chunked"]:
        return True
    if not codings or codings[-1] != b"chunked":
        raise BadRequest(400, "invalid request: Transfer-Encoding does not end with chunked")
    raise BadRequest(400, "invalid request: unsupported Transfer-Encoding (only chunked is)")


def _reason(exc: Exception) -> str:
    text = str(exc)
    return text.removeprefix("invalid ").strip() or "malformed"
