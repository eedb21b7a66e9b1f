"""WebSocket upgrades: the connection goes to trio-websocket's server side.

The server has already read the request's head (and maybe the first frames), so
the handshake is replayed to trio-websocket through `ReplayStream` and it parses
and answers it itself. The resulting `trio_websocket.WebSocketRequest` goes to
`serve_realtime(ctx, request)`, which authenticates, resolves the model and accepts
or rejects (DESIGN "Request path" 4); an unknown path gets the JSON 404.
"""

from __future__ import annotations

import trio
import trio_websocket

from troupe.http.context import RouterContext
from troupe.http.server.exchange import Exchange
from troupe.http.server.parse import Request
from troupe.realtime import serve_realtime

__all__ = ["ReplayStream", "serve_upgrade"]

HANDSHAKE_TIMEOUT = 10.0


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


async def serve_upgrade(
    ctx: RouterContext, exchange: Exchange, stream: trio.abc.Stream, rest: bytes
) -> None:
    """Hand the connection to trio-websocket and the request to `serve_realtime`."""
    replay = ReplayStream(stream, handshake_bytes(exchange.request) + rest)
    async with trio.open_nursery() as nursery:
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as handshake:
            request = await trio_websocket.wrap_server_stream(
                nursery, replay, max_message_size=ctx.settings.ws_max_message_bytes
            )
        if not handshake.cancelled_caught:
            exchange.started = True
            await serve_realtime(ctx, request)
        nursery.cancel_scope.cancel()
