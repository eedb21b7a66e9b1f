"""The HTTP relay: one request to a child, its response streamed back chunk by chunk.

Works on plain ASGI (scope and send) and a pooled keep-alive connection per child,
so the hot path does not depend on the web framework (DESIGN "The hot path").
Header rules follow llama.cpp's ``server_http_proxy`` (spec §3.6).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import cast

import httpx
import trio

from troupe.http.asgi import Scope, Send, send_response
from troupe.http.errors import JSON_TYPE, dumps

__all__ = ["Relay"]

log = logging.getLogger("troupe.proxy")

CHILD_HOST = "127.0.0.1"
_DROP_REQUEST = frozenset({b"accept-encoding", b"transfer-encoding", b"content-length", b"host"})
# X-Accel-Buffering: the child sends its own on streams; ours goes on every response.
_DROP_RESPONSE = frozenset(
    {
        "server",
        "transfer-encoding",
        "content-length",
        "keep-alive",
        "connection",
        "x-accel-buffering",
    }
)
CLOSE_GRACE = 2.0  # seconds to close an upstream response when the client went away


def request_headers(scope: Scope, port: int) -> list[tuple[bytes, bytes]]:
    """The client's headers for the child: de-duplicated by name, Host rewritten."""
    seen: set[bytes] = set()
    out = [(b"host", f"{CHILD_HOST}:{port}".encode())]
    for key, value in scope["headers"]:
        if key in _DROP_REQUEST or key in seen:
            continue
        seen.add(key)
        out.append((key, value))
    return out


def response_headers(upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
    content_type = JSON_TYPE
    out: list[tuple[bytes, bytes]] = []
    for key, value in upstream.headers.raw:
        lowered = key.decode("latin-1").lower()
        if lowered in _DROP_RESPONSE or lowered.startswith("access-control-"):
            continue
        if lowered == "content-type":
            content_type = value.decode("latin-1")
            continue
        out.append((key, value))
    out.append((b"content-type", content_type.encode("latin-1")))
    out.append((b"x-accel-buffering", b"no"))  # streamed responses must not be buffered by nginx
    return out


class Relay:
    """Pooled connections to every child; `relay` proxies one request."""

    def __init__(self, timeout: float) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            follow_redirects=True,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def relay(
        self,
        scope: Scope,
        send: Send,
        *,
        port: int,
        body: bytes,
        method: str | None = None,
        path: str | None = None,
        detached: bool = False,
        crash_detail: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        """Send the request to the child on ``port`` and stream its answer to ``send``.

        ``detached``: the request is guaranteed to reach the child even if the client
        disconnects while the child has not answered yet (conversation requests, §6.6).
        ``crash_detail``: why the child died (its last log lines), asked for when the
        connection breaks, so the client learns more than "connection lost".
        """
        target = (
            path
            if path is not None
            else scope.get("raw_path", b"").decode("latin-1") or scope["path"]
        )
        url = f"http://{CHILD_HOST}:{port}{target}"
        if scope.get("query_string") and "?" not in target:
            url += "?" + scope["query_string"].decode("latin-1")
        # A bare httpx.Request: the client's default headers (gzip, user agent) stay out.
        request = httpx.Request(
            method or scope["method"], url, headers=request_headers(scope, port), content=body
        )
        try:
            with trio.CancelScope(shield=detached):
                upstream = await self._send(request)
        except httpx.HTTPError as exc:
            log.warning("proxy error for %s: %s", url, exc)
            text = f"proxy error: {_describe(exc)}"
            detail = await crash_detail() if crash_detail is not None else None
            if detail:
                text += f" ({detail})"
            await send_response(send, 500, text.encode(), "text/plain")
            return
        headers = response_headers(upstream)
        streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
        try:
            await send(
                {"type": "http.response.start", "status": upstream.status_code, "headers": headers}
            )
            chunks = cast(AsyncGenerator[bytes, None], upstream.aiter_raw())
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    if chunk:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            log.warning("child connection lost during %s: %s", url, exc)
            if not streaming:
                raise ChildLost(str(exc)) from exc  # a truncated JSON body must look truncated
            # An SSE client gets a final error event, as llama-server sends for a failed stream.
            detail = await crash_detail() if crash_detail is not None else None
            message = "the model's server closed the connection" + (f": {detail}" if detail else "")
            error = {"error": {"code": 500, "message": message, "type": "server_error"}}
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + dumps(error) + b"\n\n",
                    "more_body": True,
                }
            )
        finally:
            # Closing at once tells the child the client is gone, so it stops generating.
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
                await upstream.aclose()
        await send({"type": "http.response.body", "body": b""})

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._client.send(request, stream=True)
        except httpx.RemoteProtocolError:
            # llama-server closes a connection after an SSE stream although it said
            # keep-alive; a request sent on such a pooled connection dies before any
            # answer. Once more, on a fresh connection.
            log.debug("pooled connection to the child was closed; retrying on a new one")
            return await self._client.send(request, stream=True)


class ChildLost(Exception):
    """The child's connection broke after the response had started."""


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "Could not establish connection"
    if isinstance(exc, httpx.TimeoutException):
        return "Read timeout" if isinstance(exc, httpx.ReadTimeout) else "Connection timeout"
    return str(exc) or type(exc).__name__
