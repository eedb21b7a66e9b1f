"""Serving the front with hypercorn on Trio, with the settings an LLM proxy needs."""

from __future__ import annotations

import logging
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from troupe.http.asgi import ASGIApp
from troupe.http.context import RouterContext
from troupe.http.front import Front
from troupe.http.routes import create_local_app

__all__ = ["hypercorn_config", "serve_http"]

GRACEFUL_TIMEOUT = 1.0


def _bind(host: str, port: int) -> str:
    if host.endswith(".sock"):
        return f"unix:{host}"
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"  # IPv6
    return f"{host}:{port}"


def hypercorn_config(ctx: RouterContext) -> Config:
    s = ctx.settings
    config = Config()
    config.bind = [_bind(h, s.port) for h in s.hosts]
    config.include_server_header = False  # every response says "Server: llama.cpp" instead
    # The drain already let requests in flight finish; what is left (idle keep-alive
    # connections, a request cut at the drain deadline) gets this long.
    config.graceful_timeout = GRACEFUL_TIMEOUT
    config.keep_alive_timeout = 5
    config.read_timeout = s.timeout
    config.websocket_max_message_size = s.ws_max_message_bytes
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    if s.ssl_cert_file and s.ssl_key_file:
        config.certfile = str(s.ssl_cert_file)
        config.keyfile = str(s.ssl_key_file)
    return config


async def serve_http(
    ctx: RouterContext, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve until ``ctx.http_stop`` is set; reports the bound URLs once listening."""
    app = Front(ctx, cast(ASGIApp, create_local_app(ctx)))
    try:
        await serve(
            app,  # type: ignore[arg-type]
            hypercorn_config(ctx),
            shutdown_trigger=ctx.http_stop.wait,
            task_status=task_status,
        )
    finally:
        ctx.http_done.set()
