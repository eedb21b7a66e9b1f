"""WebSocket upgrades: the connection goes to trio-websocket's server side.

The server has already read the request's head (and maybe the first frames), so
the handshake is replayed to trio-websocket through `ReplayStream` and it parses
and answers it itself. The resulting `trio_websocket.WebSocketRequest` goes to
the door the service plugged in (`troupe.realtime.serve_realtime`), which
authenticates, resolves the model and accepts or rejects (ARCHITECTURE.md, actors);
an unknown path gets the JSON 404.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable

import trio
import trio_websocket

from troupe.assembly import Troupe
from troupe.http.access import UPGRADE_CLIENT
from troupe.http.errors import error_body
from troupe.http.server.exchange import Exchange
from troupe.http.server.parse import Request

__all__ = ["ReplayStream", "WebSocketDoor", "serve_upgrade"]

HANDSHAKE_TIMEOUT = 10.0
# What serves an accepted handshake: it accepts or rejects, then runs the connection.
WebSocketDoor = Callable[[Troupe, trio_websocket.WebSocketRequest], Awaitable[None]]


class ReplayStream(trio.abc.Stream):
    """``stream``, with ``prefix`` received first (bytes already read off it)."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()


def handshake_bytes(request: Request) -> bytes:
    """The request's head as the client sent it (names lower-cased by the parser)."""
    lines = [
        b"%b %b HTTP/%b\r\n"
        % (request.method.encode(), request.target, request.http_version.encode())
    ]
    lines += [b"%b: %b\r\n" % (key, value) for key, value in request.headers]
    return b"".join(lines) + b"\r\n"


def handshake_error(request: Request) -> str | None:
    """What is wrong with a WebSocket opening handshake (RFC 6455 4.2.1), if anything:
    wsproto accepts any key, and a client that sends a broken one is answered 400."""
    fields = {key: value for key, value in request.headers}
    version = fields.get(b"sec-websocket-version", b"")
    if version != b"13":
        return "unsupported Sec-WebSocket-Version (13 is)"
    try:
        key = base64.b64decode(fields.get(b"sec-websocket-key", b""), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 16:
        return "invalid Sec-WebSocket-Key (16 bytes in base64)"
    return None


async def serve_upgrade(
    ctx: Troupe, door: WebSocketDoor, exchange: Exchange, stream: trio.abc.Stream, rest: bytes
) -> None:
    """Hand the connection to trio-websocket and the request to ``door``."""
    problem = handshake_error(exchange.request)
    if problem is not None:
        extra = [(b"sec-websocket-version", b"13")] if "Version" in problem else []
        status = 426 if "Version" in problem else 400
        await exchange.respond(status, error_body(problem, "invalid_request_error"), headers=extra)
        return
    replay = ReplayStream(stream, handshake_bytes(exchange.request) + rest)
    async with trio.open_nursery() as nursery:
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as handshake:
            request = await trio_websocket.wrap_server_stream(
                nursery, replay, max_message_size=ctx.settings.ws_max_message_bytes
            )
        if not handshake.cancelled_caught:
            exchange.started = True
            UPGRADE_CLIENT.set(exchange.client)  # for the session's access record
            await door(ctx, request)
        nursery.cancel_scope.cancel()
