"""troupe's HTTP/1.1 server with a test's own handler, over a real socket on a free
port: its mechanics (deadlines, caps, the drain) without the router behind it."""

from __future__ import annotations

from typing import TypeVar

import trio

from troupe.http.server.config import ServerConfig
from troupe.http.server.connection import Handler
from troupe.http.server.lifecycle import HttpServer

__all__ = ["read_all", "serve_bare"]

H = TypeVar("H", bound=Handler)


async def serve_bare(
    nursery: trio.Nursery, handler: H, config: ServerConfig
) -> tuple[HttpServer, H, int]:
    """The server, serving in ``nursery``; its handler; its port."""
    server = HttpServer(handler, config)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await nursery.start(server.serve, listeners)
    return server, handler, port


async def read_all(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes (bounded), then closed here too."""
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    return data
