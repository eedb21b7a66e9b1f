"""The header fields a relayed request and answer carry: the client's request for the
child (de-duplicated, Host rewritten, hop-by-hop fields dropped: connections to children
are pooled and kept alive) and the child's answer head for the client (as upstream's
proxy: the child's Server, framing, hop-by-hop and CORS fields dropped, ours added)."""

from __future__ import annotations

from collections.abc import Sequence

from troupe.api import JSON_TYPE
from troupe.proxy.upstream import UpstreamResponse

__all__ = ["CHILD_HOST", "request_bytes", "request_headers", "response_fields"]

CHILD_HOST = "127.0.0.1"
# Hop-by-hop fields stay out too: connections to children are pooled and kept alive;
# the body is sent whole, so no Expect either.
_DROP_REQUEST = frozenset(
    {
        b"accept-encoding",
        b"transfer-encoding",
        b"content-length",
        b"host",
        b"connection",
        b"keep-alive",
        b"expect",
        b"te",
        b"upgrade",
    }
)
# X-Accel-Buffering: the child sends its own on streams; ours goes on every response.
_DROP_RESPONSE = frozenset(
    {
        b"server",
        b"transfer-encoding",
        b"content-length",
        b"keep-alive",
        b"connection",
        b"x-accel-buffering",
        b"content-type",
    }
)
_JSON_TYPE = JSON_TYPE.encode()


def request_headers(headers: Sequence[tuple[bytes, bytes]], port: int) -> list[tuple[bytes, bytes]]:
    """The client's headers for the child: de-duplicated by name, Host rewritten."""
    seen: set[bytes] = set()
    out = [(b"host", f"{CHILD_HOST}:{port}".encode())]
    for key, value in headers:
        if key in _DROP_REQUEST or key in seen:
            continue
        seen.add(key)
        out.append((key, value))
    return out


def request_bytes(
    method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], port: int, body: bytes
) -> bytes:
    parts = [method.encode(), b" ", target, b" HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % port]
    seen: set[bytes] = set()
    for key, value in headers:
        if key in _DROP_REQUEST or key in seen:
            continue
        seen.add(key)
        parts += (key, b": ", value, b"\r\n")
    parts.append(b"content-length: %d\r\n\r\n" % len(body))
    parts.append(body)
    return b"".join(parts)


def response_fields(upstream: UpstreamResponse) -> bytes:
    """The child's header lines as the client gets them (as upstream's proxy)."""
    content_type = _JSON_TYPE
    out = []
    for key, value in upstream.headers:
        lowered = key.lower()
        if lowered in _DROP_RESPONSE or lowered.startswith(b"access-control-"):
            if lowered == b"content-type":
                content_type = value
            continue
        out.append(b"%b: %b\r\n" % (key, value))
    out.append(b"Content-Type: %b\r\nX-Accel-Buffering: no\r\n" % content_type)
    return b"".join(out)
