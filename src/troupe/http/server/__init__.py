"""The lean HTTP/1.1 server troupe listens with: Trio sockets, llhttp, no framework.

`serve_http` binds every ``--host``, serves the front (the relay for proxied routes,
the Quart app for the router's own) until ``ctx.http_stop`` is set, then drains
(bounded) and sets ``ctx.http_done``. The running `HttpServer` is ``ctx.http_server``
for a finer-grained drain (stop accepting, close idle, wait, cancel).
"""

from __future__ import annotations

import logging
from typing import cast

import trio

from troupe.http.front import Front
from troupe.http.routes import create_local_app
from troupe.http.server.asgi_adapter import ASGIApp, AsgiApp
from troupe.http.server.config import ServerConfig
from troupe.http.server.lifecycle import HttpServer
from troupe.http.server.listen import open_listeners
from troupe.router import Router
from troupe.settings.router import RouterSettings

__all__ = ["DRAIN_TIMEOUT", "HttpServer", "ServerConfig", "serve_http", "server_config"]

log = logging.getLogger("troupe.http")

# service.shutdown has already waited for leases (--drain-timeout); what is left (a
# request cut at that deadline, a router-local stream) gets this long.
DRAIN_TIMEOUT = 1.0


def server_config(settings: RouterSettings) -> ServerConfig:
    return ServerConfig(
        max_body=settings.max_body_bytes,
        read_timeout=float(settings.timeout),
        ws_max_message=settings.ws_max_message_bytes,
    )


async def serve_http(
    ctx: Router,
    *,
    config: ServerConfig | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``ctx.http_stop`` is set; reports the bound URLs once listening."""
    try:
        settings = ctx.settings
        scheme = "https" if settings.ssl_cert_file and settings.ssl_key_file else "http"
        local = AsgiApp(cast(ASGIApp, create_local_app(ctx)), scheme=scheme)
        server = HttpServer(Front(ctx, local), config or server_config(settings))
        ctx.http_server = server
        bound = await open_listeners(settings)
        server.urls = bound.urls
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(local.run_lifespan)
                await nursery.start(server.serve, bound.listeners)
                task_status.started(bound.urls)
                await ctx.http_stop.wait()
                await server.drain(DRAIN_TIMEOUT)
                await local.shutdown()
                nursery.cancel_scope.cancel()
        finally:
            bound.remove_unix_sockets()
    finally:
        ctx.http_done.set()
