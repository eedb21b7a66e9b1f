"""The access record of one proxied request, begun as it arrives and ended once.

`begin` makes the `AccessRecord` (arrival time, client, route); the request's lease
(`troupe.lease.Lease`) fills in its model, waits and failure; `finish` adds the relay's
figures (status, first byte, first event, bytes, and the child's usage and timings from
the answer's tail) and hands it to the router's `RequestLog`. `recorded` gives a
router-local route its record (kind "local"); a realtime session gets one at its end
(kind "realtime")."""

from __future__ import annotations

import contextvars
import json
import time

import trio

from troupe.api import strip_prefix
from troupe.assembly import Troupe
from troupe.http.body_model import OFF_LOOP_BYTES
from troupe.http.keys import tenant_of
from troupe.http.routing import Handler
from troupe.http.server.exchange import Exchange
from troupe.http.server.parse import Request
from troupe.ops.access import AccessRecord, read_usage
from troupe.ops.metrics import route_label
from troupe.proxy.client import RelayReport

__all__ = [
    "CLIENT_CLOSED",
    "UPGRADE_CLIENT",
    "begin",
    "finish",
    "finish_realtime",
    "realtime_record",
    "recorded",
    "refused_record",
]

CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before an answer


def begin(ctx: Troupe, ex: Exchange, conversation: str = "") -> tuple[AccessRecord, float]:
    """The record, and the Trio time it started (what its durations count from)."""
    rec = AccessRecord(
        time=time.time(),
        client=ex.client,
        method=ex.method,
        path=ex.path,
        route=route_label(ex.path, ctx.settings.api_prefix),
        bytes_in=len(ex.body),
        conversation=conversation or None,
        tenant=tenant_of(ctx.tenants.current, ex.request.key_name),
    )
    if ex.method == "GET":  # a read of a child's state (GET /slots polls): not model traffic
        rec.kind = "local"
    ctx.requests.opened(rec)  # listed as in flight until it ends
    return rec, trio.current_time()


def finish(
    ctx: Troupe,
    ex: Exchange,
    rec: AccessRecord,
    started: float,
    report: RelayReport | None,
    *,
    client_left: bool,
) -> None:
    now = trio.current_time()
    rec.duration = now - started
    if report is not None and report.status:
        rec.status = report.status
        rec.bytes_out = report.bytes_out
        rec.stream = report.sse
        if report.first_byte is not None:
            rec.ttfb = report.first_byte - started
        if report.sse and report.first_body is not None:
            rec.ttft = report.first_body - started
        tail = report.tail
        if tail and rec.prompt_tokens is None and rec.completion_tokens is None:
            read_usage(tail, rec)  # (a proxied request's were read inside its lease)
        if rec.completion_tokens is None and report.tokens:
            rec.completion_tokens = report.tokens  # a cut stream: the tokens it was sent
        rec.error = rec.error or report.error
    elif ex.started:
        rec.status = ex.status
        rec.bytes_out = ex.sent
    whole = report is not None and report.whole
    if client_left and not whole:  # (one that left after the whole answer did not)
        if not ex.started:
            rec.status = CLIENT_CLOSED
        rec.error = rec.error or "the client went away"
    ctx.requests.record(rec)


# Probes and scrapes that answer well get no record: a load balancer's health check and
# Prometheus' scrape come every few seconds and say nothing about what users did (as
# nginx's `access_log off` on such a location); a failing one is recorded.
UNRECORDED_WHEN_OK = frozenset({"/health", "/v1/health", "/metrics"})


def recorded(handler: Handler) -> Handler:
    """``handler`` (a router-local route) with an access record of kind "local"."""

    async def with_record(ctx: Troupe, ex: Exchange) -> None:
        started = trio.current_time()
        try:
            await handler(ctx, ex)
        finally:
            _finish_local(ctx, ex, started)

    return with_record


def _finish_local(ctx: Troupe, ex: Exchange, started: float) -> None:
    status = ex.status if ex.started else CLIENT_CLOSED
    route = strip_prefix(ex.path, ctx.settings.api_prefix) or ex.path
    if status < 400 and route in UNRECORDED_WHEN_OK and not ex.params.get("model"):
        return
    duration = trio.current_time() - started
    rec = AccessRecord(
        time=time.time() - duration,
        client=ex.client,
        method=ex.method,
        path=ex.path,
        route=route,
        model=_model_named(ex),
        status=status,
        duration=duration,
        bytes_in=len(ex.body),
        bytes_out=ex.sent,
        kind="local",
        error=None if ex.started else "the client went away",
        tenant=tenant_of(ctx.tenants.current, ex.request.key_name),
    )
    ctx.requests.record_other(rec)


def _model_named(ex: Exchange) -> str:
    """The model a local request is about (``?model=``, or a small JSON body's)."""
    name = ex.params.get("model", "")
    if name or not ex.body.startswith(b"{") or len(ex.body) > OFF_LOOP_BYTES:
        return name  # (a large body is not parsed again on the event loop for this)
    try:
        body = json.loads(ex.body)
    except ValueError:
        return ""
    value = body.get("model") if isinstance(body, dict) else None
    return value if isinstance(value, str) else ""


def refused_record(
    ctx: Troupe, request: Request | None, status: int, message: str, body: bytes, peer: str
) -> None:
    """A request the server answered before any route ran (refused at the head: the Host,
    the key, an unknown route, not ready yet; or unreadable, too slow, too large): kind
    "local", with why. ``body``: the refusal's JSON, whose message says why when
    ``message`` does not. An attacker's flood of them is bounded by the local ring."""
    path = request.path if request is not None and request.path else "-"
    ctx.requests.record_other(
        AccessRecord(
            time=time.time(),
            client=peer,
            method=(request.method if request is not None else "") or "-",
            path=path,
            route=strip_prefix(path, ctx.settings.api_prefix) or path,
            status=status,
            bytes_out=len(body),
            kind="local",
            error=message or _message_of(body) or f"refused ({status})",
        )
    )


def _message_of(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else ""


# The client of a WebSocket upgrade (set by the HTTP side before the realtime door runs:
# trio-websocket's request does not know the socket under the replayed stream).
UPGRADE_CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("upgrade_client", default="-")


def realtime_record(ctx: Troupe, client: str, path: str, started: float) -> AccessRecord:
    """A realtime session's record, begun at its handshake (``started``: Trio time);
    `finish_realtime` hands it on at the session's end (the handshake sets its
    ``tenant`` once the key is known)."""
    path = path.partition("?")[0]  # as the other records: the query (the model) apart
    return AccessRecord(
        time=time.time() - (trio.current_time() - started),
        client=client,
        method="GET",
        path=path,
        route=strip_prefix(path, ctx.settings.api_prefix) or path,
        kind="realtime",
    )


def finish_realtime(ctx: Troupe, rec: AccessRecord, started: float) -> None:
    """A session that was accepted reaches the listeners like a proxied request (the
    per-model and per-tenant metrics, the usage ledger: its responses' tokens); a refused
    handshake is only recorded."""
    rec.duration = trio.current_time() - started
    if rec.status == 101:
        ctx.requests.record(rec)
    else:
        ctx.requests.record_other(rec)
