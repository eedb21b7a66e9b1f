"""troupe's own views of what it is doing: ``GET /troupe/requests`` (the recent proxied
requests, newest first; ``?model=``, ``?limit=``, ``?kind=``) and ``GET /troupe/version``.

They need a key when keys are configured (only the dashboard's files are public); with
several keys, a tenant's ``/troupe/requests`` lists only its own records."""

from __future__ import annotations

from troupe import __version__
from troupe.assembly import Troupe
from troupe.http.keys import viewer_of
from troupe.http.respond import send_error, send_json
from troupe.http.server.exchange import Exchange
from troupe.http.views import model_filter
from troupe.ops.access import ALL_KINDS, DEFAULT_KINDS
from troupe.ops.history import HISTORY_EVERY

__all__ = ["history", "recent_requests", "version"]

DEFAULT_LIMIT = 100


async def recent_requests(router: Troupe, ex: Exchange) -> None:
    params = ex.params
    name = params.get("model", "")
    model: str | None = None
    if name:
        entry = router.catalog.resolve(name)
        model = entry.name if entry is not None else name  # a name asked for, served or not
    limit_text = params.get("limit", "")
    if limit_text and not limit_text.isdigit():
        await send_error(ex, "limit must be a number", "invalid_request_error")
        return
    limit = int(limit_text) if limit_text else DEFAULT_LIMIT
    kinds = _kinds(params.get("kind", ""))
    if kinds is None:
        message = "kind must be a comma-separated list of " + ", ".join(sorted(ALL_KINDS))
        await send_error(ex, message + " (or all)", "invalid_request_error")
        return
    tenant = viewer_of(router.tenants.current, ex.request.key_name)
    items = [rec.to_json() for rec in router.requests.recent(model, limit, kinds, tenant)]
    await send_json(ex, {"object": "list", "data": items})


def _kinds(text: str) -> frozenset[str] | None:
    """``?kind=``: empty is the model traffic (proxied and realtime), ``all`` is every
    kind, else the named ones; None when one is unknown."""
    if not text:
        return DEFAULT_KINDS
    if text == "all":
        return ALL_KINDS
    kinds = frozenset(k.strip() for k in text.split(","))
    return kinds if kinds <= ALL_KINDS else None


async def version(router: Troupe, ex: Exchange) -> None:
    engine = router.engine
    await send_json(
        ex,
        {
            "troupe": __version__,
            "engine": {
                "path": str(engine.path),
                "version": engine.version,
                "source": engine.source,
            },
        },
    )


async def history(router: Troupe, ex: Exchange) -> None:
    """The dashboard's recent samples (`troupe.ops.history`), oldest first; with a
    tenants file, a tenant that is not admin gets only its models' memory."""
    points = [p.to_json() for p in router.history.points()]
    visible = model_filter(router, ex.request.key_name)
    if visible is not None:
        for point in points:
            point["models"] = {m: v for m, v in point["models"].items() if visible(m)}
    await send_json(ex, {"interval": HISTORY_EVERY, "points": points})
