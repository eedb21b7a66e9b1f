"""An ASGI WebSocket scope seen through trio-websocket's server API.

`serve_realtime` takes trio-websocket's ``WebSocketRequest``; until the lean HTTP
server hands it real ones, hypercorn's ASGI scopes are wrapped here in the same
API: ``path``, ``headers``, ``proposed_subprotocols``, ``accept`` and ``reject`` on
the request; ``get_message``, ``send_message``, ``aclose`` and ``closed`` on the
connection, raising ``ConnectionClosed`` once either side has closed.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
from trio_websocket import CloseReason, ConnectionClosed

from troupe.http.asgi import Receive, Scope, Send

__all__ = ["AsgiWebSocketConnection", "AsgiWebSocketRequest", "open_asgi_request"]

Headers = list[tuple[bytes, bytes]]
_NO_STATUS = 1005  # "no status received": a disconnect without a close code


async def open_asgi_request(
    scope: Scope, receive: Receive, send: Send
) -> AsgiWebSocketRequest | None:
    """The request of a WebSocket scope, once its ``websocket.connect`` arrived; None
    when the client left first."""
    first = await receive()
    if first["type"] != "websocket.connect":
        return None
    return AsgiWebSocketRequest(scope, receive, send)


class AsgiWebSocketRequest:
    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope = scope
        self._receive = receive
        self._send = send

    @property
    def path(self) -> str:
        """The request target, query included (as trio-websocket's)."""
        raw = self._scope.get("raw_path")
        path = raw.decode("latin-1") if raw else self._scope["path"]
        query = self._scope.get("query_string", b"").decode("latin-1")
        return f"{path}?{query}" if query and "?" not in path else path

    @property
    def headers(self) -> Headers:
        return [(bytes(k), bytes(v)) for k, v in self._scope["headers"]]

    @property
    def proposed_subprotocols(self) -> Sequence[str]:
        return tuple(self._scope.get("subprotocols") or ())

    async def accept(
        self, *, subprotocol: str | None = None, extra_headers: Headers | None = None
    ) -> AsgiWebSocketConnection:
        message = {"type": "websocket.accept", "subprotocol": subprotocol}
        await self._send({**message, "headers": list(extra_headers or [])})
        return AsgiWebSocketConnection(self._receive, self._send)

    async def reject(
        self, status_code: int, *, extra_headers: Headers | None = None, body: bytes | None = None
    ) -> None:
        start = {"type": "websocket.http.response.start", "status": status_code}
        await self._send({**start, "headers": list(extra_headers or [])})
        await self._send({"type": "websocket.http.response.body", "body": body or b""})


class AsgiWebSocketConnection:
    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._closed: CloseReason | None = None
        self._send_lock = trio.Lock()  # one frame at a time, whichever task sends

    @property
    def closed(self) -> CloseReason | None:
        return self._closed

    async def get_message(self) -> str | bytes:
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        message = await self._receive()
        if message["type"] == "websocket.receive":
            text = message.get("text")
            return text if text is not None else bytes(message.get("bytes") or b"")
        # websocket.disconnect (the client closed, or the connection broke)
        self._closed = CloseReason(message.get("code") or _NO_STATUS, message.get("reason"))
        raise ConnectionClosed(self._closed)

    async def send_message(self, message: str | bytes) -> None:
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        key = "text" if isinstance(message, str) else "bytes"
        async with self._send_lock:
            await self._send({"type": "websocket.send", key: message})

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        if self._closed is not None:
            return
        self._closed = CloseReason(code, reason)
        async with self._send_lock:
            await self._send({"type": "websocket.close", "code": code, "reason": reason or ""})
