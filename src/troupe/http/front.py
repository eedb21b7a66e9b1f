"""The front: llama.cpp's global middleware, then the one route table.

Order (spec §3.1): CORS headers on every response; OPTIONS answered at once; 503
until ready; the API key; the route (`troupe.http.routes.ROUTES`: relayed to a child,
or answered by the router itself; an unknown route is a JSON 404). WebSocket upgrades
go to the WebSocket door the service plugged in (the realtime API).
"""

from __future__ import annotations

import logging

import trio

from troupe.api import strip_prefix
from troupe.http import cors
from troupe.http.errors import NOT_FOUND_BODY, middleware_error_body
from troupe.http.routing import RouteTable, is_dashboard
from troupe.http.server.exchange import Exchange
from troupe.http.server.parse import Request
from troupe.http.upgrade import WebSocketDoor, serve_upgrade
from troupe.router import Router

__all__ = ["Front"]

log = logging.getLogger("troupe.http")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/"})
_SERVER = b"Server: llama.cpp\r\n"
_LOADING = middleware_error_body("Loading model", "unavailable_error", 503)
_UNAUTHORIZED = middleware_error_body("Invalid API Key", "authentication_error", 401)


class Front:
    def __init__(self, router: Router, routes: RouteTable, websocket: WebSocketDoor | None) -> None:
        self.router = router
        self.routes = routes
        self.websocket = websocket
        settings = router.settings
        self._prefix = settings.api_prefix
        self._preflight = [(k.title(), v) for k, v in cors.preflight_headers(settings)]
        self._echo_origin = settings.cors_credentials and settings.cors_origins == "*"
        # Fixed origins: the same CORS line on every response, rendered once.
        fixed = cors.allow_origin_headers(settings, None)
        self._fixed_base = _SERVER + b"".join(b"%b: %b\r\n" % (k.title(), v) for k, v in fixed)

    def base_head(self, request: Request) -> bytes:
        """``Server: llama.cpp`` and ``Access-Control-Allow-Origin`` (§3.1)."""
        settings = self.router.settings
        if self._echo_origin:
            origin = request.header(b"origin") or ""
            return _SERVER + b"Access-Control-Allow-Origin: " + origin.encode("latin-1") + b"\r\n"
        if settings.cors_origins == "localhost":
            extra = cors.allow_origin_headers(settings, request.header(b"origin"))
            return _SERVER + b"".join(b"%b: %b\r\n" % (k.title(), v) for k, v in extra)
        return self._fixed_base

    def _authorized(self, ex: Exchange, route: str | None) -> bool:
        keys = self.router.settings.api_keys
        if not keys or ex.path in PUBLIC_PATHS:
            return True
        if ex.method == "GET" and route is not None and is_dashboard(route):
            return True  # the dashboard's page asks for the key and sends it with each request
        given = ex.header(b"authorization") or ex.header(b"x-api-key") or ""
        given = given.removeprefix("Bearer ")
        return given in keys

    async def serve(self, ex: Exchange) -> None:
        router = self.router
        if ex.method == "OPTIONS":
            await ex.respond(200, b"", "text/html", self._preflight)
            return
        if not router.ready:
            await ex.respond(503, _LOADING)
            return
        route = strip_prefix(ex.path, self._prefix)
        if not self._authorized(ex, route):
            log.warning("unauthorized: Invalid API Key")
            await ex.respond(401, _UNAUTHORIZED)
            return
        handler = None if route is None else self.routes.find(ex.method, route)
        if handler is None:
            await ex.respond(404, NOT_FOUND_BODY)
            return
        await handler(router, ex)

    async def upgrade(self, ex: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        """A WebSocket upgrade: 503 before ready, like every request; the door
        authenticates and routes itself."""
        if not self.router.ready:
            await ex.respond(503, _LOADING)
            return
        if self.websocket is None:
            await ex.respond(404, NOT_FOUND_BODY)
            return
        await serve_upgrade(self.router, self.websocket, ex, stream, rest)
