"""The operations routes: ``GET /metrics`` (troupe's own, without ``?model=``; with a
tenants file, a tenant that is not admin sees only its models' and its own series,
`troupe.http.views`) and ``GET /logs/stream`` (every model's log, as SSE)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import trio
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

from troupe.api import dumps
from troupe.assembly import Troupe
from troupe.http.respond import send_error, send_stream
from troupe.http.server.exchange import Exchange
from troupe.http.views import filter_exposition, model_filter
from troupe.ops.exposition import render_metrics

__all__ = ["logs_stream", "metrics"]

_SSE_FIELDS = b"Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"


async def metrics(router: Troupe, ex: Exchange) -> None:
    node = await router.cluster.name() if router.cluster is not None else None
    body = await render_metrics(
        router.scheduler,
        router.metrics,
        router.relay.pool,
        router.settings.memory_margin_bytes,
        node,
        router.streams,
    )
    visible = model_filter(router, ex.request.key_name)
    if visible is not None:  # a tenant that is not admin: its models and its own series
        body = filter_exposition(body, visible, ex.request.key_name)
    await ex.respond(200, body, CONTENT_TYPE_PLAIN_0_0_4)


def _sse(data: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + dumps(data) + b"\n\n"


async def logs_stream(router: Troupe, ex: Exchange) -> None:
    """A model's log as SSE: its recent lines first, then each new one. Without
    ``?model=``, every model's. ``?lines=N`` limits the history, ``?no-history``
    (llama-swap) skips it. With a tenants file, an admin's only: children's logs speak
    of every tenant's requests."""
    if not router.tenants.current.may_admin(ex.request.key_name):
        message = "this API key may not read the models' logs: it needs a tenant with admin = true"
        await send_error(ex, message, "permission_error")
        return
    params = ex.params
    name = params.get("model", "")
    model: str | None = None
    if name:
        entry = router.catalog.resolve(name)
        if entry is None:  # as the proxied routes answer an unknown model
            await send_error(ex, f"model '{name}' not found", "invalid_request_error")
            return
        model = entry.name
    lines = params.get("lines", "")
    if lines and not lines.isdigit():
        await send_error(ex, "lines must be a number", "invalid_request_error")
        return
    limit = 0 if "no-history" in params else int(lines) if lines else None
    logs = router.logs

    async def events() -> AsyncGenerator[bytes, None]:
        with logs.subscribe(model) as sub:
            history = logs.recent(model, limit)
            if history:
                yield b"".join(_sse(line.to_json()) for line in history)
            else:
                yield b": no history\n\n"  # the headers and a first byte go out now
            while True:
                try:
                    batch, missed = await sub.receive()
                except trio.EndOfChannel:
                    return
                out = _sse({"missed": missed}, "missed") if missed else b""
                yield out + b"".join(_sse(line.to_json()) for line in batch)

    await send_stream(ex, _SSE_FIELDS, events())
