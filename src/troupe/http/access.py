"""The access record of one proxied request, begun as it arrives and ended once.

`begin` makes the `AccessRecord` (arrival time, client, route); the request path fills
in its model, waits and failure; `finish` adds the relay's figures (status, first byte,
first event, bytes, and the child's usage and timings from the answer's tail) and
hands it to the router's `RequestLog`.
"""

from __future__ import annotations

import time

import trio

from troupe.http.server.exchange import Exchange
from troupe.ops.access import AccessRecord, read_usage
from troupe.ops.metrics import route_label
from troupe.proxy.relay import RelayReport
from troupe.router import Router
from troupe.sched import Grant

__all__ = ["CLIENT_CLOSED", "begin", "finish", "note_wait"]

CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before an answer


def begin(ctx: Router, ex: Exchange, conversation: str = "") -> tuple[AccessRecord, float]:
    """The record, and the Trio time it started (what its durations count from)."""
    rec = AccessRecord(
        time=time.time(),
        client=ex.client,
        method=ex.method,
        path=ex.path,
        route=route_label(ex.path, ctx.settings.api_prefix),
        bytes_in=len(ex.body),
        conversation=conversation or None,
    )
    return rec, trio.current_time()


def note_wait(ctx: Router, rec: AccessRecord, waited: float, grant: Grant | None) -> None:
    """Split a wait for the model into its queue part and its load part: a grant that
    waited for a load spent the model's last load time (spawn to ready) loading."""
    if grant is not None and grant.waited:
        view = ctx.scheduler.snapshot.models.get(grant.model)
        load = view.last_load_seconds if view is not None else None
        load = min(waited, load) if load is not None else waited
        rec.load_wait, rec.queue_wait = load, max(0.0, waited - load)
    else:
        rec.queue_wait, rec.load_wait = waited, 0.0


def finish(
    ctx: Router,
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
        if tail:
            read_usage(tail, rec)
        rec.error = rec.error or report.error
    elif ex.started:
        rec.status = ex.status
        rec.bytes_out = ex.sent
    if client_left:
        if not ex.started:
            rec.status = CLIENT_CLOSED
        rec.error = rec.error or "the client went away"
    ctx.requests.record(rec)
