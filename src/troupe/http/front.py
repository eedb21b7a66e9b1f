"""The front: llama.cpp's global middleware, then the one route table.

Order (llama-server's own): CORS headers on every response; OPTIONS answered at once; 503
until ready; the API key; the route (`troupe.http.routes.ROUTES`: relayed to a child,
or answered by the router itself; an unknown route is a JSON 404). WebSocket upgrades
go to the WebSocket door the service plugged in (the realtime API).

All of it is decided at the head (`Front.admit`, called by the server's parser once a
head is complete, before a byte of the body is read): a refused request with a body
is answered and its connection closed unread, and ``100 Continue`` only goes to a
request that will be served. Before all of it, on a loopback listener, the Host
check (`troupe.http.hosts`), then on every listener the Origin check
(`troupe.http.cors.OriginCheck`: a browser page from an origin not allowed gets 403,
its request never runs). ``HEAD`` is served as ``GET`` without the body. ``/health``
and ``/v1/health`` answer with and without the ``--api-prefix``, as upstream.
"""

from __future__ import annotations

import logging

import trio

from troupe.api import dumps, strip_prefix
from troupe.assembly import Troupe
from troupe.cluster.kvsync import KV_PATH
from troupe.cluster.view import FORWARDED
from troupe.http import cors
from troupe.http.access import refused_record
from troupe.http.errors import NOT_FOUND_BODY, error_body, middleware_error_body
from troupe.http.hosts import HostCheck
from troupe.http.proxy_routes import handle_proxy_get, handle_proxy_post, handle_stream_get
from troupe.http.respond import LOCAL_MAX_BODY
from troupe.http.routing import Handler, RouteTable, is_dashboard
from troupe.http.server.exchange import Exchange
from troupe.http.server.parse import Refusal, Request
from troupe.http.upgrade import WebSocketDoor, serve_upgrade

__all__ = ["Front"]

log = logging.getLogger("troupe.http")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/"})
HEALTH_PATHS = frozenset({"/health", "/v1/health"})  # also outside the --api-prefix
_SERVER = b"Server: llama.cpp\r\n"
_LOADING = middleware_error_body("Loading model", "unavailable_error", 503)
_UNAUTHORIZED = middleware_error_body("Invalid API Key", "authentication_error", 401)
_BAD_HOST = middleware_error_body(
    "Host not allowed (DNS rebinding protection: see --allowed-hosts)", "permission_error", 403
)
_REFUSE_LOADING = Refusal(503, _LOADING)
_REFUSE_KEY = Refusal(401, _UNAUTHORIZED)
# Ollama's shape on its API: its clients show the "error" string, not a raw dict.
_REFUSE_KEY_OLLAMA = Refusal(401, dumps({"error": "Invalid API Key"}))
_REFUSE_MARK = Refusal(
    401,
    middleware_error_body(
        "invalid cluster forward mark (x-troupe-forwarded is for the cluster's own nodes)",
        "authentication_error",
        401,
    ),
)
_REFUSE_NODE = Refusal(
    401,
    middleware_error_body(
        "this route is for the cluster's own nodes (a signed x-troupe-forwarded)",
        "authentication_error",
        401,
    ),
)
_BAD_ORIGIN = middleware_error_body(
    "Origin not allowed (a browser page from another site: see --cors-origins)",
    "permission_error",
    403,
)
_REFUSE_HOST = Refusal(403, _BAD_HOST)
_REFUSE_ORIGIN = Refusal(403, _BAD_ORIGIN)
_REFUSE_ROUTE = Refusal(404, NOT_FOUND_BODY)
# Methods no route takes a body for: a request declaring one is refused at its head,
# before a byte of it is read (a public GET /health cannot hold a connection open
# awaiting a body). A DELETE may take one (Ollama's /api/delete).
_NO_BODY = frozenset({"GET", "HEAD", "OPTIONS"})
# Routes whose body goes to a child (up to --max-body-mib); every other takes a small
# JSON document (LOCAL_MAX_BODY).
_RELAYED: frozenset[Handler] = frozenset({handle_proxy_post, handle_proxy_get, handle_stream_get})


def _no_body(request: Request) -> Refusal:
    """400 for a body where none is taken: llama.cpp's error shape, Ollama's on /api/."""
    message = f"{request.method} {request.path[:200]} takes no request body"
    if request.path.startswith("/api/"):
        return Refusal(400, dumps({"error": message}))
    return Refusal(400, error_body(message, "invalid_request_error"))


class Front:
    def __init__(self, router: Troupe, routes: RouteTable, websocket: WebSocketDoor | None) -> None:
        self.router = router
        self.routes = routes
        self.websocket = websocket
        settings = router.settings
        self._prefix = settings.api_prefix
        self._hosts = HostCheck(settings.hosts, settings.allowed_hosts)
        self._origins = cors.OriginCheck(settings.allowed_origins)
        self._preflight = [(k.title(), v) for k, v in cors.preflight_headers(settings)]
        self._echo_origin = settings.cors_credentials and settings.cors_origins == "*"
        # Fixed origins: the same CORS line on every response, rendered once.
        fixed = cors.allow_origin_headers(settings, None)
        self._fixed_base = _SERVER + b"".join(b"%b: %b\r\n" % (k.title(), v) for k, v in fixed)

    def base_head(self, request: Request) -> bytes:
        """``Server: llama.cpp`` and ``Access-Control-Allow-Origin``, as llama-server sets them."""
        settings = self.router.settings
        if self._echo_origin:
            origin = request.header(b"origin")
            if not origin or not self._origins.allows(origin, request.authority):
                # Refused: its page gets nothing to read. No Origin (curl, SDKs): no page
                # to tell, and an empty header (llama-server's echo) is not a valid one.
                return _SERVER
            return _SERVER + b"Access-Control-Allow-Origin: " + origin.encode("latin-1") + b"\r\n"
        if settings.cors_origins == "localhost":
            extra = cors.allow_origin_headers(settings, request.header(b"origin"))
            return _SERVER + b"".join(b"%b: %b\r\n" % (k.title(), v) for k, v in extra)
        return self._fixed_base

    def _key_name(self, request: Request, route: str | None) -> str | None:
        """Whose key the request carries ("" where none is needed), None if refused. The
        live tenant book's keys (`troupe.tenants`): a reload counts from the next head."""
        keys = self.router.tenants.current
        if not keys or request.path in PUBLIC_PATHS or route in PUBLIC_PATHS:
            return ""
        if request.method == "GET" and route is not None and is_dashboard(route):
            return ""  # the dashboard's page asks for the key and sends it with each request
        given = request.header(b"authorization") or request.header(b"x-api-key") or ""
        tenant = keys.match(given.removeprefix("Bearer "))
        return None if tenant is None else tenant.name

    def admit(self, request: Request) -> Refusal | None:
        """The whole decision, at the head: a refusal, or the handler in ``request.route``."""
        if not self._hosts.allows(request.authority):
            log.warning("refused Host %r (DNS rebinding protection)", request.authority[:100])
            return _REFUSE_HOST
        if not self._origins.allows(request.header(b"origin"), request.authority):
            log.warning(
                "refused Origin %r (see --cors-origins)", (request.header(b"origin") or "")[:100]
            )
            return _REFUSE_ORIGIN
        if request.method in _NO_BODY and request.has_body:
            return _no_body(request)
        if request.method == "OPTIONS":
            request.route = self._options
            return None
        if not self.router.ready:
            return _REFUSE_LOADING
        if request.method == "HEAD":
            request.method = "GET"  # served as a GET; the exchange sends no body
        route = strip_prefix(request.path, self._prefix)
        if route is None and request.path in HEALTH_PATHS:
            route = request.path  # health probes know nothing of the prefix
        if route is not None and (route == KV_PATH or route.startswith(KV_PATH + "/")):
            return self._admit_node_route(request, route)
        name = self._key_name(request, route)
        if name is None:
            log.warning("unauthorized: Invalid API Key")
            return _REFUSE_KEY_OLLAMA if (route or "").startswith("/api/") else _REFUSE_KEY
        request.key_name = name
        if not self._mark_trusted(request):
            log.warning("refused a forward mark that does not verify (x-troupe-forwarded)")
            return _REFUSE_MARK
        handler = None if route is None else self.routes.find(request.method, route)
        if handler is None:
            return _REFUSE_ROUTE
        request.route = handler
        if handler not in _RELAYED and request.max_body > LOCAL_MAX_BODY:
            request.max_body = LOCAL_MAX_BODY
        return None

    def _admit_node_route(self, request: Request, route: str) -> Refusal | None:
        """A node-to-node route (a KV slot file pushed or fetched,
        `troupe.cluster.kvsync`): only with a node's own mark signed with the cluster
        secret, whatever key it carries; one 401 for every other caller, so none learns
        what the store holds."""
        cluster = self.router.cluster
        mark = request.header(FORWARDED)
        target = request.target.decode("latin-1")
        if (
            cluster is None
            or mark is None
            or request.method != "POST"
            or not cluster.trust.verify(mark, "POST", target, node_only=True)
        ):
            log.warning("refused %s %s: not a node's signed mark", request.method, route[:100])
            return _REFUSE_NODE
        handler = self.routes.find(request.method, route)
        if handler is None:
            return _REFUSE_NODE
        request.key_name = ""
        request.route = handler
        if route != KV_PATH and request.max_body > LOCAL_MAX_BODY:
            request.max_body = LOCAL_MAX_BODY  # a fetch's tokens; a push takes a slot file
        return None

    def _mark_trusted(self, request: Request) -> bool:
        """A request marked as forwarded within the cluster is served where it lands;
        with a cluster secret, only if the mark verifies (`troupe.cluster.trust`)."""
        cluster = self.router.cluster
        if cluster is None or not cluster.trust.signed:
            return True
        mark = request.header(FORWARDED)
        return mark is None or cluster.trusts(
            mark, request.method, request.target.decode("latin-1")
        )

    def refused(
        self, request: Request | None, status: int, message: str, body: bytes, peer: str
    ) -> None:
        """Into the access record: what the server answered before any route ran."""
        refused_record(self.router, request, status, message, body, peer)

    async def _options(self, router: Troupe, ex: Exchange) -> None:
        await ex.respond(200, b"", "text/html", self._preflight)

    async def serve(self, ex: Exchange) -> None:
        request = ex.request
        handler = request.route
        if handler is None:  # not admitted yet (a connection past the cap: /health)
            refusal = self.admit(request)
            if refusal is not None:
                refused_record(self.router, request, refusal.status, "", refusal.body, ex.client)
                await ex.respond_refusal(refusal)
                return
            handler = request.route
        if request.key_name and log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s by %s", request.method, request.path, request.key_name)
        await handler(self.router, ex)

    async def upgrade(self, ex: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        """A WebSocket upgrade: 503 before ready, like every request; the door
        authenticates and routes itself."""
        if not self._hosts.allows(ex.request.authority):
            await ex.respond(403, _BAD_HOST)
            return
        if not self._origins.allows(ex.request.header(b"origin"), ex.request.authority):
            log.warning("refused a WebSocket from Origin %r", ex.request.header(b"origin"))
            await ex.respond(403, _BAD_ORIGIN)
            return
        if not self.router.ready:
            await ex.respond(503, _LOADING)
            return
        if self.websocket is None:
            await ex.respond(404, NOT_FOUND_BODY)
            return
        await serve_upgrade(self.router, self.websocket, ex, stream, rest)
