"""`serve_http`: the front on the lean HTTP/1.1 server (`troupe.http.server`).

It binds every ``--host`` and serves the front (every route from the one
route table, WebSocket upgrades through the door it is given) until
``router.http_stop`` is set; then it ends the log streams, drains (bounded) and sets
``router.http_done``. The running `HttpServer` is ``router.http_server``, for a
finer-grained drain (stop accepting, close idle, wait, cancel).
"""

from __future__ import annotations

import logging

import trio

from troupe.assembly import Troupe
from troupe.http.front import Front
from troupe.http.routes import ROUTES
from troupe.http.routing import RouteTable
from troupe.http.server.config import ServerConfig
from troupe.http.server.lifecycle import HttpServer
from troupe.http.server.listen import open_listeners
from troupe.http.upgrade import WebSocketDoor
from troupe.settings.router import RouterSettings

__all__ = ["DRAIN_TIMEOUT", "serve_http", "server_config"]

log = logging.getLogger("troupe.http")

# service.shutdown has already waited for leases (--drain-timeout); what is left (a
# request cut at that deadline, a router-local stream) gets this long.
DRAIN_TIMEOUT = 1.0


def server_config(settings: RouterSettings) -> ServerConfig:
    return ServerConfig(
        max_body=settings.max_body_bytes,
        read_timeout=float(settings.timeout),
        body_timeout=settings.body_timeout,
        max_connections=settings.max_connections,
        max_per_client=settings.max_connections_per_client,
        body_min_rate=settings.body_min_rate,
        body_rate_grace=settings.body_rate_grace,
        ws_max_message=settings.ws_max_message_bytes,
    )


async def serve_http(
    router: Troupe,
    *,
    websocket: WebSocketDoor | None = None,
    routes: RouteTable = ROUTES,
    config: ServerConfig | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``router.http_stop`` is set; reports the bound URLs once listening."""
    try:
        settings = router.settings
        server = HttpServer(Front(router, routes, websocket), config or server_config(settings))
        router.http_server = server
        bound = await open_listeners(settings)
        server.urls = bound.urls
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve, bound.listeners)
                task_status.started(bound.urls)
                await router.http_stop.wait()
                router.logs.close()  # log streams end before the drain would cut them
                await server.drain(DRAIN_TIMEOUT)
                nursery.cancel_scope.cancel()
        finally:
            bound.remove_unix_sockets()
    finally:
        router.http_done.set()
