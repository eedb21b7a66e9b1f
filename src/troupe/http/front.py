"""The ASGI front: llama.cpp's global middleware, then the relay or the router's own routes.

Order (spec §3.1): CORS headers on every response; OPTIONS answered at once; 503
until ready; the API key; routing (an unknown route is a JSON 404). Proxied routes
are handled here on plain ASGI (the hot path); the router's own routes go to the
Quart app.
"""

from __future__ import annotations

import logging

from troupe.http import cors
from troupe.http.asgi import ASGIApp, Receive, Scope, Send, header, send_response
from troupe.http.context import RouterContext
from troupe.http.errors import middleware_error_body
from troupe.http.proxy_routes import handle_proxy_get, handle_proxy_post, handle_stream_get
from troupe.http.routing import Route, classify, is_dashboard, strip_prefix
from troupe.realtime import open_asgi_request, serve_realtime

__all__ = ["Front"]

log = logging.getLogger("troupe.http")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/"})


class Front:
    def __init__(self, ctx: RouterContext, local: ASGIApp) -> None:
        self.ctx = ctx
        self.local = local

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.local(scope, receive, send)  # lifespan

    def _authorized(self, scope: Scope) -> bool:
        keys = self.ctx.settings.api_keys
        if not keys or scope["path"] in PUBLIC_PATHS:
            return True
        route = strip_prefix(scope["path"], self.ctx.settings.api_prefix)
        if scope.get("method") == "GET" and route is not None and is_dashboard(route):
            return True  # the dashboard's page asks for the key and sends it with each request
        given = header(scope, b"authorization") or header(scope, b"x-api-key") or ""
        given = given.removeprefix("Bearer ")
        return given in keys

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = self.ctx.settings
        extra = cors.allow_origin_headers(settings, header(scope, b"origin"))
        send = _with_headers(send, [(b"server", b"llama.cpp"), *extra])
        if scope["method"] == "OPTIONS":
            await send_response(send, 200, b"", "text/html", cors.preflight_headers(settings))
            return
        if not self.ctx.ready:
            body = middleware_error_body("Loading model", "unavailable_error", 503)
            await send_response(send, 503, body)
            return
        if not self._authorized(scope):
            log.warning("unauthorized: Invalid API Key")
            body = middleware_error_body("Invalid API Key", "authentication_error", 401)
            await send_response(send, 401, body)
            return
        route = classify(scope["method"], scope["path"], settings.api_prefix, scope)
        if route is Route.PROXY_POST:
            await handle_proxy_post(self.ctx, scope, receive, send)
        elif route is Route.PROXY_GET:
            await handle_proxy_get(self.ctx, scope, receive, send)
        elif route is Route.STREAM_GET:
            await handle_stream_get(self.ctx, scope, receive, send)
        elif route is Route.LOCAL:
            await self.local(scope, receive, send)
        else:
            body = middleware_error_body("File Not Found", "not_found_error", 404)
            await send_response(send, 404, body)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Readiness, the key, the route and the model are the realtime handshake's to
        # check: its refusals are HTTP answers with upstream's JSON bodies.
        request = await open_asgi_request(scope, receive, send)
        if request is not None:
            await serve_realtime(self.ctx, request)


def _with_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """Add ``headers`` to the response start, replacing what the handler set for them."""
    names = {k for k, _ in headers}

    async def wrapped(message: dict) -> None:  # type: ignore[type-arg]
        if message["type"] == "http.response.start":
            kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
            message = {**message, "headers": kept + headers}
        await send(message)

    return wrapped  # type: ignore[return-value]
