"""The HTTP relay: one request to a child, its response streamed back chunk by chunk.

Works on plain ASGI (scope and send) and a pooled keep-alive connection per child,
so the hot path does not depend on the web framework (DESIGN "The hot path").
Header rules follow llama.cpp's ``server_http_proxy`` (spec §3.6).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from troupe.http.asgi import Scope, Send, send_response
from troupe.http.errors import JSON_TYPE, dumps
from troupe.proxy.pool import UpstreamPool
from troupe.proxy.upstream import Child, UpstreamError, UpstreamResponse

__all__ = ["ChildLost", "Relay"]

log = logging.getLogger("troupe.proxy")

CHILD_HOST = "127.0.0.1"
# Hop-by-hop headers stay out too: connections to children are pooled and kept alive.
_DROP_REQUEST = frozenset(
    {
        b"accept-encoding",
        b"transfer-encoding",
        b"content-length",
        b"host",
        b"connection",
        b"keep-alive",
    }
)
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
Observe = Callable[[Scope, Send, int], Send]  # wraps one response's send (troupe.ops.metrics)


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


def response_headers(upstream: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    content_type = JSON_TYPE
    out: list[tuple[bytes, bytes]] = []
    for key, value in upstream.headers:
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

    def __init__(self, timeout: float, observe: Observe | None = None) -> None:
        # upstream: connect and read time out after --timeout (3600 s by default); a
        # long prefill sends nothing for a while, so reads get the whole of it.
        self._pool = UpstreamPool(CHILD_HOST, connect_timeout=timeout, read_timeout=timeout)
        self._observe: Observe = observe or (lambda scope, send, body_bytes: send)

    async def aclose(self) -> None:
        await self._pool.aclose()

    def forget(self, model: str, gen: int) -> None:
        """The scheduler stopped the child ``(model, gen)``, or saw it exit."""
        self._pool.forget(model, gen)

    def set_limit(self, model: str, gen: int, connections: int) -> None:
        """The child ``(model, gen)`` started; it serves ``connections`` at once."""
        self._pool.set_limit(model, gen, connections)

    @property
    def pool(self) -> UpstreamPool:
        """The one transport to children, for callers that speak to them directly
        (the realtime sessions)."""
        return self._pool

    @property
    def idle_connections(self) -> int:
        return self._pool.idle_count

    async def fetch(
        self, scope: Scope, child: Child, method: str, target: str, body: bytes
    ) -> tuple[int, bytes] | None:
        """A small whole answer from ``child``, or None when it cannot answer. Bound it
        with a cancel scope (stream lookups and deletes get 250 ms, §10)."""
        try:
            upstream = await self._pool.request(
                child, method, target, request_headers(scope, child.port), body
            )
            try:
                data = b"".join([chunk async for chunk in upstream.chunks()])
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
                    await upstream.aclose()
        except UpstreamError as exc:
            log.warning("request to %s failed: %s %s: %s", child.model, method, target, exc)
            return None
        return upstream.status_code, data

    async def relay(
        self,
        scope: Scope,
        send: Send,
        *,
        child: Child,
        body: bytes,
        method: str | None = None,
        path: str | None = None,
        detached: bool = False,
        crash_detail: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        """Send the request to ``child`` and stream its answer to ``send``.

        ``detached``: the request is guaranteed to reach the child even if the client
        disconnects while the child has not answered yet (conversation requests, §6.6).
        ``crash_detail``: why the child died (its last log lines), asked for when the
        connection breaks, so the client learns more than "connection lost".
        """
        send = self._observe(scope, send, len(body))  # metrics: status and bytes relayed
        target = path or scope.get("raw_path", b"").decode("latin-1") or scope["path"]
        if scope.get("query_string") and "?" not in target:
            target += "?" + scope["query_string"].decode("latin-1")
        try:
            with trio.CancelScope(shield=detached):
                upstream = await self._pool.request(
                    child,
                    method or scope["method"],
                    target,
                    request_headers(scope, child.port),
                    body,
                )
        except UpstreamError as exc:
            log.warning("proxy error for %s %s: %s", child.model, target, exc)
            text = f"proxy error: {exc}"
            detail = await crash_detail() if crash_detail is not None else None
            if detail:
                text += f" ({detail})"
            await send_response(send, 500, text.encode(), "text/plain")
            return
        streaming = (upstream.header(b"content-type") or "").startswith("text/event-stream")
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": upstream.status_code,
                    "headers": response_headers(upstream),
                }
            )
            async for chunk in upstream.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:
            log.warning("child connection lost during %s: %s", target, exc)
            if not streaming:
                raise ChildLost(str(exc)) from exc  # a truncated JSON body must look truncated
            # An SSE client gets a final error event, as llama-server sends for a failed stream.
            detail = await crash_detail() if crash_detail is not None else None
            message = "the model's server closed the connection" + (f": {detail}" if detail else "")
            error = {"error": {"code": 500, "message": message, "type": "server_error"}}
            event = b"data: " + dumps(error) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            # Closing an unfinished answer tells the child the client is gone, so it stops
            # generating; a finished one returns its connection to the pool.
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
                await upstream.aclose()
        await send({"type": "http.response.body", "body": b""})


class ChildLost(Exception):
    """The child's connection broke after the response had started."""
