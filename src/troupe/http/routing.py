"""Which handler serves a request: the relay (POST by body, GET by query) or the router."""

from __future__ import annotations

import enum

from troupe.http.asgi import Scope, query_params

__all__ = [
    "DASHBOARD",
    "LOCAL_ROUTES",
    "PROXY_GET_PATHS",
    "PROXY_GET_WITH_MODEL",
    "PROXY_POST_PATHS",
    "Route",
    "classify",
    "is_dashboard",
    "strip_prefix",
]

# POST routes whose model comes from the JSON body (spec §3.5).
PROXY_POST_PATHS = frozenset(
    {
        "/completion",
        "/completions",
        "/v1/completions",
        "/chat/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/control",
        "/v1/responses",
        "/responses",
        "/v1/audio/transcriptions",
        "/audio/transcriptions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/infill",
        "/embedding",
        "/embeddings",
        "/v1/embeddings",
        "/rerank",
        "/reranking",
        "/v1/rerank",
        "/v1/reranking",
        "/v1/systemone",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens",
        "/responses/input_tokens",
        "/v1/responses/input_tokens",
        "/lora-adapters",
        "/props",
    }
)
# GET routes whose model comes from ?model=.
PROXY_GET_PATHS = frozenset({"/slots", "/lora-adapters"})
# Proxied only with ?model=; without it the router answers: GET /props (upstream), and
# GET /metrics, troupe's own metrics (upstream answers 400 there: a deliberate deviation).
PROXY_GET_WITH_MODEL = frozenset({"/props", "/metrics"})
DASHBOARD = "/troupe"  # the dashboard's pages (troupe.ops.dashboard), clear of the web UI's

LOCAL_ROUTES = frozenset(
    {
        ("GET", "/health"),
        ("GET", "/v1/health"),
        ("GET", "/props"),
        ("GET", "/models"),
        ("GET", "/v1/models"),
        ("GET", "/models/sse"),
        ("GET", "/metrics"),
        ("GET", "/logs/stream"),
        ("POST", "/models"),
        ("POST", "/models/load"),
        ("POST", "/models/unload"),
        ("DELETE", "/models"),
        ("POST", "/v1/streams/lookup"),
        ("DELETE", "/v1/stream"),
        ("GET", "/tools"),
        ("POST", "/tools"),
        ("GET", "/cors-proxy"),
        ("POST", "/cors-proxy"),
    }
)


class Route(enum.Enum):
    PROXY_POST = "proxy_post"
    PROXY_GET = "proxy_get"
    STREAM_GET = "stream_get"  # GET /v1/stream: relayed to the conversation's child
    LOCAL = "local"
    NOT_FOUND = "not_found"


def strip_prefix(path: str, prefix: str) -> str | None:
    """``path`` without the ``--api-prefix``; None when it is outside the prefix."""
    if not prefix:
        return path
    if path == prefix or not path.startswith(prefix + "/"):
        return None
    return path[len(prefix) :]


def classify(method: str, path: str, prefix: str, scope: Scope) -> Route:
    route = strip_prefix(path, prefix)
    if route is None:
        return Route.NOT_FOUND
    if method == "POST" and (route in PROXY_POST_PATHS or _is_slot_action(route)):
        return Route.PROXY_POST
    if method == "GET" and (
        route in PROXY_GET_PATHS
        or (route in PROXY_GET_WITH_MODEL and query_params(scope).get("model"))
    ):
        return Route.PROXY_GET
    if method == "GET" and route == "/v1/stream":
        return Route.STREAM_GET
    if (method, route) in LOCAL_ROUTES or (method == "GET" and is_dashboard(route)):
        return Route.LOCAL
    return Route.NOT_FOUND


def _is_slot_action(route: str) -> bool:
    """``POST /slots/:id_slot`` (e.g. ``?action=save``)."""
    head, _, slot_id = route.rpartition("/")
    return head == "/slots" and bool(slot_id)


def is_dashboard(route: str) -> bool:
    """The dashboard's page and static files (public, like the web UI: they hold no data)."""
    return route == DASHBOARD or route.startswith(DASHBOARD + "/")
