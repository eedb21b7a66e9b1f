"""Proxied routes: find the model a request names, lease its child, relay (see walk 1 of
ARCHITECTURE.md)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import trio

from troupe.actors.scheduler import ModelUnavailable
from troupe.assembly import Troupe
from troupe.conversations import child_id
from troupe.http import access
from troupe.http.body_model import BadBody, model_from_body
from troupe.http.cluster_forward import forward_elsewhere, stream_elsewhere
from troupe.http.errors import error_body
from troupe.http.keys import tenant_of
from troupe.http.loading import SSE_FIELDS, AfterHead, Style, heralded, progress_style
from troupe.http.respond import send_failure
from troupe.http.server.exchange import Exchange
from troupe.kvstore import cached_held, tokens_held
from troupe.lease import NO_SLOT, Lease, autoload_flag
from troupe.ops.access import read_usage
from troupe.proxy.client import ChildLost, RelayReport
from troupe.sched import Snapshot, Status

__all__ = ["handle_proxy_get", "handle_proxy_post", "handle_stream_get"]

log = logging.getLogger("troupe.http")


def _crash_detail(ctx: Troupe, model: str) -> Callable[[], Awaitable[str | None]]:
    async def detail() -> str | None:
        # The connection broke; the scheduler learns why (exit code, log tail) a moment later.
        def gone(snapshot: Snapshot) -> bool:
            view = snapshot.models.get(model)
            return view is None or view.status is Status.UNLOADED

        with trio.move_on_after(1.0):
            await ctx.scheduler.wait_until(gone)
            view = ctx.scheduler.snapshot.models.get(model)
            if view is not None and view.last_error:
                return f"model {model} crashed: {view.last_error}"
        return None

    return detail


async def _guarded(ex: Exchange, work: Callable[[], Awaitable[None]]) -> bool:
    """``work`` until it ends or the client leaves (then True); a child lost after the
    response started leaves the response truncated (the connection closes)."""
    lost = False

    async def run() -> None:
        nonlocal lost
        try:
            await work()
        except ChildLost:
            lost = True

    # A client that goes away cancels its wait (it leaves the queue) or its relay (the
    # child stops generating at once).
    gone = await ex.until_client_leaves(run)
    if lost:
        ex.keep_alive = False
    return gone


async def _serve(
    ctx: Troupe, ex: Exchange, name: str, *, update_last_used: bool, conv_id: str = ""
) -> None:
    rec, started = access.begin(ctx, ex, conv_id)
    rec.model = name
    report = RelayReport()
    ctx.streams.open(name, report)  # its tokens per second while it streams (dashboard)
    held = Lease(
        ctx, name, autoload=autoload_flag(ex.params, ctx.settings.models_autoload),
        update_last_used=update_last_used, tenant=rec.tenant, conversation=conv_id,
        stoppable=True, record=rec, body=ex.body,
    )  # fmt: skip
    gone = False
    try:
        failure = held.check()
        if failure is not None:  # answered before the client is watched
            await send_failure(ex, failure)
            return

        style = progress_style(ctx, ex, held.model)

        async def work() -> None:
            if style is not None:  # a streamed completion that waits for a load
                await _relay_after_load(ctx, ex, held, report, style)
                return
            try:
                async with held:
                    if held.rate_fields:  # a tenant with limits: x-ratelimit-* on the answer
                        ex.base += held.rate_fields
                    await _relay(ctx, ex, held, report)
            except ModelUnavailable as exc:  # (the lease set the record's error)
                await send_failure(ex, exc.failure)

        gone = await _guarded(ex, work)
    finally:
        ctx.streams.close(report)
        access.finish(ctx, ex, rec, started, report, client_left=gone)


async def _relay_after_load(
    ctx: Troupe, ex: Exchange, held: Lease, report: RelayReport, style: Style
) -> None:
    """The head at once and the load's progress while the lease waits, then the child's
    stream in the same response; a refusal after the head ends it with an error event
    (`troupe.http.loading`)."""
    async with heralded(ctx, ex, held.model, SSE_FIELDS, style) as herald:
        try:
            async with held:
                await herald.settle()
                if not ex.started:  # (the grant came before the head went out)
                    if held.rate_fields:
                        ex.base += held.rate_fields
                    await _relay(ctx, ex, held, report)
                    return
                report.first_byte = herald.first_byte
                client = AfterHead(ex)
                try:
                    await _relay(ctx, client, held, report)
                    await client.finish()
                finally:
                    report.bytes_out += herald.sent
        except ModelUnavailable as exc:  # (the lease set the record's error)
            await herald.settle()
            await herald.fail(exc.failure)


async def _relay(ctx: Troupe, ex: Exchange | AfterHead, held: Lease, report: RelayReport) -> None:
    grant = held.grant
    kv = ctx.kv if ex.method == "POST" else None  # the KV store steers POST bodies
    if kv is not None and kv.refuses(grant.model, ex.path):
        # The engine's own words, as a child without a slot path answers.
        message = "This server does not support slots action. Start it with `--slot-save-path`"
        await ex.respond(501, error_body(message, "not_supported_error"))
        return
    async with NO_SLOT if kv is None else held.slot(ex.path, ex.body) as hold:
        await ctx.relay.relay(
            ex,
            child=grant,
            body=ex.body if hold is None else hold.body,
            detached=held.stoppable and bool(held.conversation) and grant.waited,
            crash_detail=_crash_detail(ctx, grant.model),
            report=report,
        )
        if hold is not None and hold.slot is not None:
            hold.tokens = tokens_held(report.tail)  # what the slot holds now
            hold.cached = cached_held(report.tail)  # what it reused (a restore's check)
    if held.record is not None and report.tail:
        read_usage(report.tail, held.record)  # the release reports them (fair queuing)


async def handle_proxy_post(ctx: Troupe, ex: Exchange) -> None:
    try:
        name = await model_from_body(ex.body, ex.header(b"content-type"))
    except BadBody as exc:
        await ex.respond(400, error_body(str(exc), "invalid_request_error"))
        return
    if ctx.cluster is not None and await forward_elsewhere(ctx, ex, name):
        return  # another node's model: served there (--cluster-nodes)
    conv_id = ex.header(b"x-conversation-id") or ""
    owner = tenant_of(ctx.tenants.current, ex.request.key_name)
    if conv_id and owner:  # the child keeps the stream under the owner's id
        headers = ex.request.headers
        for i, (key, _value) in enumerate(headers):
            if key == b"x-conversation-id":
                headers[i] = (key, child_id(conv_id, owner).encode("latin-1"))
    await _serve(ctx, ex, name, update_last_used=True, conv_id=conv_id)


async def handle_proxy_get(ctx: Troupe, ex: Exchange) -> None:
    name = ex.params.get("model", "")
    # GET does not count as use: a dashboard polling /slots must not keep a model warm.
    await _serve(ctx, ex, name, update_last_used=False)


async def handle_stream_get(ctx: Troupe, ex: Exchange) -> None:
    """``GET /v1/stream?conv_id=&from=``: replay from the child that owns the conversation,
    under a lease (the child cannot be evicted mid-replay), stopped if the client leaves."""
    params = ex.params
    conv_id = params.get("conv_id", "")
    if not conv_id:
        await ex.respond(
            400, error_body("Missing conversation id in path", "invalid_request_error")
        )
        return
    # Another tenant's conversation is one that does not exist (the same 404).
    owner = tenant_of(ctx.tenants.current, ex.request.key_name)
    model = ctx.conversations.lookup(conv_id, owner=owner)
    if model is None and ctx.cluster is not None and await stream_elsewhere(ctx, ex):
        return  # another node holds it (--cluster-nodes)
    if model is None:  # unknown, or another tenant's: no child is asked
        await ex.respond(404, error_body("Stream not found or expired", "not_found_error"))
        return
    path = f"/v1/stream?conv_id={quote(child_id(conv_id, owner), safe='')}"
    if params.get("from"):
        path += f"&from={quote(params['from'], safe='')}"

    async def work() -> None:
        async with ctx.scheduler.lease_if_ready(model) as grant:
            if grant is not None:
                await ctx.relay.relay(ex, child=grant, body=b"", method="GET", target=path)
                return
        view = ctx.scheduler.snapshot.models.get(model)
        if view is not None and view.status in (
            Status.LOADING,
            Status.DOWNLOADING,
            Status.DOWNLOADED,
        ):
            body = error_body("Stream owner model is loading, retry later", "unavailable_error")
            await ex.respond(503, body)
        else:
            await ex.respond(404, error_body("Stream not found or expired", "not_found_error"))

    await _guarded(ex, work)
