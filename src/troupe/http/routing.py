"""Which handler serves a request: the relay (POST by body, GET by query) or the router."""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = [
    "LOCAL_ROUTES",
    "PROXY_GET_PATHS",
    "PROXY_POST_PATHS",
    "Route",
    "classify",
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
# GET routes whose model comes from ?model= (GET /props only when it has one).
PROXY_GET_PATHS = frozenset({"/metrics", "/slots", "/lora-adapters"})

LOCAL_ROUTES = frozenset(
    {
        ("GET", "/health"),
        ("GET", "/v1/health"),
        ("GET", "/props"),
        ("GET", "/models"),
        ("GET", "/v1/models"),
        ("GET", "/models/sse"),
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


def classify(method: str, path: str, prefix: str, params: Mapping[str, str]) -> Route:
    route = strip_prefix(path, prefix)
    if route is None:
        return Route.NOT_FOUND
    if method == "POST" and (route in PROXY_POST_PATHS or _is_slot_action(route)):
        return Route.PROXY_POST
    if method == "GET" and (
        route in PROXY_GET_PATHS or (route == "/props" and params.get("model"))
    ):
        return Route.PROXY_GET
    if method == "GET" and route == "/v1/stream":
        return Route.STREAM_GET
    if (method, route) in LOCAL_ROUTES:
        return Route.LOCAL
    return Route.NOT_FOUND


def _is_slot_action(route: str) -> bool:
    """``POST /slots/:id_slot`` (e.g. ``?action=save``)."""
    head, _, slot_id = route.rpartition("/")
    return head == "/slots" and bool(slot_id)
