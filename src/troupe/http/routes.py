"""THE route table: every route troupe serves, proxied or its own, and its handler.

The front looks a request up here once (`RouteTable.find`), which both classifies it
(relayed to a child or answered by the router; an unknown route is the JSON 404) and
dispatches it. Proxied routes come from llama-server's API (`troupe.api`); GET /props
and GET /metrics are the child's with ``?model=`` and the router's without. Handlers
that wait (on the scheduler, the hub, a child, a stream) are `watched`: a client that
goes away cancels them.
"""

from __future__ import annotations

from troupe.api import PROXY_GET_PATHS, PROXY_GET_WITH_MODEL, PROXY_POST_PATHS
from troupe.assembly import Troupe
from troupe.cluster.kvsync import KV_FETCH, KV_PATH
from troupe.http import (
    activity_routes,
    dashboard,
    kv_routes,
    model_routes,
    ops_routes,
    slot_routes,
    streams,
    usage_routes,
)
from troupe.http.access import recorded
from troupe.http.proxy_routes import handle_proxy_get, handle_proxy_post, handle_stream_get
from troupe.http.respond import watched
from troupe.http.routing import DASHBOARD, Handler, RouteTable, Under
from troupe.http.server.exchange import Exchange

__all__ = ["ROUTES"]


def _child_with_model(router_own: Handler) -> Handler:
    """A GET the child answers when ``?model=`` names one, the router otherwise."""

    async def handler(router: Troupe, ex: Exchange) -> None:
        if ex.params.get("model"):
            await handle_proxy_get(router, ex)
        else:
            await router_own(router, ex)

    return handler


_OWN_GET_WITH_MODEL: dict[str, Handler] = {
    "/props": model_routes.props,
    "/metrics": watched(ops_routes.metrics),
}

_ROUTER_OWN: dict[tuple[str, str], Handler] = {
    ("GET", "/health"): model_routes.health,
    ("GET", "/v1/health"): model_routes.health,
    ("GET", "/models"): watched(model_routes.models),
    ("GET", "/v1/models"): watched(model_routes.models),
    ("GET", "/models/sse"): watched(model_routes.models_sse),
    ("POST", "/models"): watched(model_routes.download),
    ("POST", "/models/load"): watched(model_routes.load),
    ("POST", "/models/unload"): watched(model_routes.unload),
    ("POST", "/models/reload"): watched(model_routes.reload),
    ("DELETE", "/models"): watched(model_routes.remove),
    ("GET", "/logs/stream"): watched(ops_routes.logs_stream),
    ("POST", "/v1/streams/lookup"): watched(streams.streams_lookup),
    ("DELETE", "/v1/stream"): watched(streams.stream_delete),
    ("GET", "/tools"): model_routes.disabled,
    ("POST", "/tools"): model_routes.disabled,
    ("GET", "/cors-proxy"): model_routes.disabled,
    ("POST", "/cors-proxy"): model_routes.disabled,
    ("GET", DASHBOARD): dashboard.dashboard_root,
    ("GET", DASHBOARD + "/requests"): activity_routes.recent_requests,
    ("GET", DASHBOARD + "/version"): activity_routes.version,
    ("GET", DASHBOARD + "/history"): activity_routes.history,
    ("GET", DASHBOARD + "/usage"): usage_routes.usage,
    # Node to node (admitted only with a node's signed mark: `Front.admit`).
    # (A push is not cut when its sender leaves: nothing half-stored stays either way.)
    ("POST", KV_PATH): kv_routes.kv_push,
    ("POST", KV_FETCH): watched(kv_routes.kv_fetch),
}

ROUTES = RouteTable(
    [
        *((("POST", path), handle_proxy_post) for path in PROXY_POST_PATHS),
        *((("GET", path), handle_proxy_get) for path in PROXY_GET_PATHS - {"/slots"}),
        # Several keys: each tenant sees only its own requests' slots.
        (("GET", "/slots"), slot_routes.slots),
        *(
            (("GET", p), _child_with_model(recorded(_OWN_GET_WITH_MODEL[p])))
            for p in PROXY_GET_WITH_MODEL
        ),
        (("GET", "/v1/stream"), handle_stream_get),  # relayed to the conversation's child
        # The router's own routes: each with an access record of kind "local".
        *((key, recorded(handler)) for key, handler in _ROUTER_OWN.items()),
    ],
    [
        Under("POST", "/slots/", handle_proxy_post, segment=True),  # ?action=save|restore
        Under("GET", DASHBOARD + "/", recorded(dashboard.dashboard_file)),
    ],
)
