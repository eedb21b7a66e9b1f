"""The operations routes: ``GET /metrics``, ``GET /logs/stream`` and the dashboard."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import trio
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from quart import Response, request
from quart_trio import QuartTrio

from troupe.http.errors import JSON_TYPE, dumps, error_body
from troupe.ops.children import merge_families, scrape_children
from troupe.ops.dashboard import register_dashboard_routes
from troupe.ops.state import ScrapeState, state_families
from troupe.router import Router
from troupe.sched.memory import MemorySample

__all__ = ["register_ops_routes", "render_metrics"]

log = logging.getLogger("troupe.metrics")


class _Families:
    """What `generate_latest` reads: a fixed list of families."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


async def _sample(ctx: Router, pids: list[int]) -> MemorySample | None:
    sampler = ctx.scheduler.sampler
    if sampler is None:
        return None
    try:
        return await sampler.asample(pids)
    except Exception as exc:  # a failed reading leaves the memory gauges out, not the scrape
        log.warning("memory reading for /metrics failed: %s", exc)
        return None


async def render_metrics(ctx: Router) -> bytes:
    """troupe's exposition: its counters, the snapshot's gauges, the children's own."""
    snap = ctx.scheduler.snapshot
    running = [v for v in snap.models.values() if v.status.is_running]
    ports = {v.name: v.port for v in running if v.port and v.status.is_ready_or_sleeping}
    sample = await _sample(ctx, [v.pid for v in running if v.pid])
    children, up = await scrape_children(ctx.relay.pool, ports)
    state = ScrapeState(
        snapshot=ctx.scheduler.snapshot,  # the freshest, after the awaits above
        margin=ctx.settings.memory_margin_bytes,
        swaps_per_minute=ctx.metrics.swaps_per_minute(ctx.scheduler.snapshot),
        sample=sample,
        children_up=up,
    )
    own = generate_latest(ctx.metrics.registry)
    return own + generate_latest(_Families(state_families(state) + merge_families(children)))


def _sse(data: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + dumps(data) + b"\n\n"


def register_ops_routes(app: QuartTrio, ctx: Router) -> None:
    prefix = ctx.settings.api_prefix

    @app.before_serving
    async def end_log_streams_at_shutdown() -> None:
        async def watch() -> None:
            await ctx.http_stop.wait()
            ctx.logs.close()  # streams end before the server's graceful window cuts them

        app.nursery.start_soon(watch)

    @app.get(prefix + "/metrics")
    async def metrics() -> Response:
        body = await render_metrics(ctx)
        return Response(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)

    @app.get(prefix + "/logs/stream")
    async def logs_stream() -> Response:
        """A model's log as SSE: its recent lines first, then each new one. Without
        ``?model=``, every model's. ``?lines=N`` limits the history, ``?no-history``
        (llama-swap) skips it."""
        name = request.args.get("model", "")
        model: str | None = None
        if name:
            entry = ctx.catalog.resolve(name)
            if entry is None:  # as the proxied routes answer an unknown model
                body = error_body(f"model '{name}' not found", "invalid_request_error")
                return Response(body, status=400, content_type=JSON_TYPE)
            model = entry.name
        lines = request.args.get("lines", "")
        if lines and not lines.isdigit():
            body = error_body("lines must be a number", "invalid_request_error")
            return Response(body, status=400, content_type=JSON_TYPE)
        limit = 0 if "no-history" in request.args else int(lines) if lines else None

        async def events() -> AsyncIterator[bytes]:
            with ctx.logs.subscribe(model) as sub:
                history = ctx.logs.recent(model, limit)
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

        response = Response(events(), content_type="text/event-stream")
        response.timeout = None
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Accel-Buffering"] = "no"
        return response

    register_dashboard_routes(app, ctx)
