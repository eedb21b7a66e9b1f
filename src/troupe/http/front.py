"""The front: llama.cpp's global middleware, then the relay or the router's own routes.

Order (spec §3.1): CORS headers on every response; OPTIONS answered at once; 503
until ready; the API key; routing (an unknown route is a JSON 404). Proxied routes
are relayed here, on the lean server (the hot path); the router's own routes go to
the Quart app through the ASGI adapter; WebSocket upgrades to trio-websocket.
"""

from __future__ import annotations

import logging

import trio

from troupe.http import cors
from troupe.http.errors import NOT_FOUND_BODY, middleware_error_body
from troupe.http.proxy_routes import handle_proxy_get, handle_proxy_post, handle_stream_get
from troupe.http.routing import Route, classify, is_dashboard, strip_prefix
from troupe.http.server.asgi_adapter import AsgiApp
from troupe.http.server.exchange import Exchange
from troupe.http.server.parse import Request
from troupe.http.upgrade import serve_upgrade
from troupe.router import Router

__all__ = ["Front"]

log = logging.getLogger("troupe.http")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/"})
_SERVER = b"Server: llama.cpp\r\n"
_LOADING = middleware_error_body("Loading model", "unavailable_error", 503)
_UNAUTHORIZED = middleware_error_body("Invalid API Key", "authentication_error", 401)


class Front:
    def __init__(self, ctx: Router, local: AsgiApp) -> None:
        self.ctx = ctx
        self.local = local
        settings = ctx.settings
        self._preflight = [(k.title(), v) for k, v in cors.preflight_headers(settings)]
        self._echo_origin = settings.cors_credentials and settings.cors_origins == "*"
        # Fixed origins: the same CORS line on every response, rendered once.
        fixed = cors.allow_origin_headers(settings, None)
        self._fixed_base = _SERVER + b"".join(b"%b: %b\r\n" % (k.title(), v) for k, v in fixed)

    def base_head(self, request: Request) -> bytes:
        """``Server: llama.cpp`` and ``Access-Control-Allow-Origin`` (§3.1)."""
        settings = self.ctx.settings
        if self._echo_origin:
            origin = request.header(b"origin") or ""
            return _SERVER + b"Access-Control-Allow-Origin: " + origin.encode("latin-1") + b"\r\n"
        if settings.cors_origins == "localhost":
            extra = cors.allow_origin_headers(settings, request.header(b"origin"))
            return _SERVER + b"".join(b"%b: %b\r\n" % (k.title(), v) for k, v in extra)
        return self._fixed_base

    def _authorized(self, ex: Exchange) -> bool:
        keys = self.ctx.settings.api_keys
        if not keys or ex.path in PUBLIC_PATHS:
            return True
        route = strip_prefix(ex.path, self.ctx.settings.api_prefix)
        if ex.method == "GET" and route is not None and is_dashboard(route):
            return True  # the dashboard's page asks for the key and sends it with each request
        given = ex.header(b"authorization") or ex.header(b"x-api-key") or ""
        given = given.removeprefix("Bearer ")
        return given in keys

    async def serve(self, ex: Exchange) -> None:
        ctx = self.ctx
        if ex.method == "OPTIONS":
            await ex.respond(200, b"", "text/html", self._preflight)
            return
        if not ctx.ready:
            await ex.respond(503, _LOADING)
            return
        if not self._authorized(ex):
            log.warning("unauthorized: Invalid API Key")
            await ex.respond(401, _UNAUTHORIZED)
            return
        route = classify(ex.method, ex.path, ctx.settings.api_prefix, ex.params)
        if route is Route.PROXY_POST:
            await handle_proxy_post(ctx, ex)
        elif route is Route.PROXY_GET:
            await handle_proxy_get(ctx, ex)
        elif route is Route.STREAM_GET:
            await handle_stream_get(ctx, ex)
        elif route is Route.LOCAL:
            await self.local.handle(ex)
        else:
            await ex.respond(404, NOT_FOUND_BODY)

    async def upgrade(self, ex: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        """A WebSocket upgrade: 503 before ready, like every request; the realtime
        entry point authenticates and routes itself."""
        if not self.ctx.ready:
            await ex.respond(503, _LOADING)
            return
        await serve_upgrade(self.ctx, ex, stream, rest)
