"""Proxied routes: find the model a request names, lease its child, relay (spec §3.5)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import quote

import trio

from troupe.actors.scheduler import ModelUnavailable
from troupe.catalog import ModelEntry
from troupe.conversations import child_id
from troupe.http import access
from troupe.http.body_model import BadBody, model_from_body
from troupe.http.cluster_forward import forward_elsewhere, stream_elsewhere
from troupe.http.errors import error_body
from troupe.http.keys import tenant_of
from troupe.http.respond import send_failure
from troupe.http.server.exchange import Exchange
from troupe.kvstore import Hold, cached_held, tokens_held
from troupe.ops.access import AccessRecord
from troupe.proxy.relay import ChildLost, RelayReport
from troupe.router import Router
from troupe.sched import FAKE_TIMING_DELAY, Failure, Grant, Snapshot, Status

__all__ = [
    "acquire_within",
    "autoload_flag",
    "handle_proxy_get",
    "handle_proxy_post",
    "handle_stream_get",
    "validate_model",
]

log = logging.getLogger("troupe.http")


def autoload_flag(params: Mapping[str, str], default: bool) -> bool:
    """``?autoload=``: empty means the server setting; else true only for "true" or "1"."""
    value = params.get("autoload", "")
    return default if value == "" else value in ("true", "1")


def validate_model(ctx: Router, name: str, autoload: bool) -> ModelEntry | Failure:
    """upstream ``router_validate_model``: missing, unknown, or not loaded without autoload."""
    if not name:
        return Failure.bad_request("model name is missing from the request")
    entry = ctx.catalog.resolve(name)
    if entry is None:
        return Failure.bad_request(f"model '{name}' not found")
    rejected = ctx.rejection(entry)
    if rejected:
        return Failure.bad_request(f"model '{entry.name}' cannot be served: {rejected}")
    if not autoload:
        view = ctx.scheduler.snapshot.models.get(entry.name)
        if view is None or not view.status.is_running:
            return Failure.bad_request("model is not loaded")
    return entry


async def acquire_within(
    ctx: Router, model: str, *, autoload: bool, update_last_used: bool
) -> tuple[int, Grant]:
    """`Scheduler.acquire` bounded by ``--queue-timeout``: a wait that lasts longer
    leaves the queue and fails with a clear 503."""
    timeout = ctx.settings.queue_timeout
    if timeout is None:
        return await ctx.scheduler.acquire(
            model, autoload=autoload, update_last_used=update_last_used
        )
    with trio.move_on_after(timeout):
        return await ctx.scheduler.acquire(
            model, autoload=autoload, update_last_used=update_last_used
        )
    view = ctx.scheduler.snapshot.models.get(model)
    state = f" (it is {view.status})" if view is not None else ""
    raise ModelUnavailable(
        Failure.unavailable(f"timed out after {timeout:g} s waiting for model {model}{state}")
    )


def _crash_detail(ctx: Router, model: str) -> Callable[[], Awaitable[str | None]]:
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
    ctx: Router, ex: Exchange, name: str, *, update_last_used: bool, conv_id: str = ""
) -> None:
    rec, started = access.begin(ctx, ex, conv_id)
    rec.model = name
    report = RelayReport()
    gone = False
    try:
        autoload = autoload_flag(ex.params, ctx.settings.models_autoload)
        checked = validate_model(ctx, name, autoload)
        if isinstance(checked, Failure):
            rec.error = checked.message
            await send_failure(ex, checked)
            return
        rec.model, rec.catalogued = checked.name, True

        async def work() -> None:
            await _lease_and_relay(
                ctx, ex, checked, autoload, update_last_used, conv_id, rec, report
            )

        gone = await _guarded(ex, work)
    finally:
        access.finish(ctx, ex, rec, started, report, client_left=gone)


async def _lease_and_relay(
    ctx: Router,
    ex: Exchange,
    entry: ModelEntry,
    autoload: bool,
    update_last_used: bool,
    conv_id: str,
    rec: AccessRecord,
    report: RelayReport,
) -> None:
    scheduler = ctx.scheduler
    tracker = ctx.conversations
    asked = trio.current_time()
    granted: Grant | None = None
    # Registered before the wait, so a stop issued while the model loads can cancel it.
    owner = tenant_of(ctx.settings, ex.request.key_name)
    ticket = tracker.remember(conv_id, entry.name, owner=owner) if conv_id else 0
    outcome = "cancelled"  # a wait that ends in neither a grant nor a failure
    refused: Failure | None = None
    try:
        # A conversation's wait ignores the client going away (a page reload must not
        # cancel the load); only a stop of the conversation cancels it (§6.6).
        if ticket:
            with trio.CancelScope(shield=True) as wait_scope:
                tracker.attach(conv_id, ticket, wait_scope, owner=owner)
                rid, grant = await acquire_within(
                    ctx, entry.name, autoload=autoload, update_last_used=update_last_used
                )
                granted = grant
        else:
            rid, grant = await acquire_within(
                ctx, entry.name, autoload=autoload, update_last_used=update_last_used
            )
            granted = grant
    except ModelUnavailable as exc:
        outcome, refused = "failed", exc.failure
    except Exception:
        outcome = "failed"
        raise
    finally:
        if ticket:
            tracker.detach(conv_id, ticket, owner=owner)
        # One clock read for the wait's histogram and the access record.
        waited = trio.current_time() - asked
        ctx.metrics.observe_queue_wait(
            entry.name, "granted" if granted is not None else outcome, waited
        )
        access.note_wait(ctx, rec, waited, granted)
    if refused is not None:
        rec.error = refused.message
        await send_failure(ex, refused)
        return
    if ticket and (wait_scope.cancelled_caught or not tracker.alive(conv_id, ticket, owner=owner)):
        if not wait_scope.cancelled_caught:
            await scheduler.release(rid)
        msg = "request cancelled by a stop while the model was loading"
        rec.error = msg
        await send_failure(ex, Failure.bad_request(msg))
        return
    try:
        if ctx.fake_timing:
            await trio.sleep(FAKE_TIMING_DELAY)  # counted busy meanwhile, like upstream
        body = ex.body
        if ctx.kv is not None and ex.method == "POST" and ctx.kv.refuses(grant.model, ex.path):
            # The engine's own words, as a child without a slot path answers.
            message = "This server does not support slots action. Start it with `--slot-save-path`"
            await ex.respond(501, error_body(message, "not_supported_error"))
            return
        async with contextlib.AsyncExitStack() as stack:
            hold: Hold | None = None
            if ctx.kv is not None and ex.method == "POST":
                # Held on a slot of this child while it is relayed: its conversation's,
                # or one whose conversation the store saved first, with this one's
                # stored entry restored into it (bounded; any trouble leaves it as it came).
                # With several keys, only this key's conversations (`tenant_of`).
                hold = await stack.enter_async_context(
                    ctx.kv.steered(
                        grant.model, grant.gen, grant.port, ex.path, body, conv_id, tenant=owner
                    )
                )
                body = hold.body
            await ctx.relay.relay(
                ex,
                child=grant,
                body=body,
                detached=bool(ticket) and grant.waited,
                crash_detail=_crash_detail(ctx, grant.model),
                report=report,
            )
            if hold is not None and hold.slot is not None:
                hold.tokens = tokens_held(report.tail)  # what the slot holds now
                hold.cached = cached_held(report.tail)  # what it reused (a restore's check)
    finally:
        await scheduler.release(rid)


async def handle_proxy_post(ctx: Router, ex: Exchange) -> None:
    try:
        name = await model_from_body(ex.body, ex.header(b"content-type"))
    except BadBody as exc:
        await ex.respond(400, error_body(str(exc), "invalid_request_error"))
        return
    if ctx.cluster is not None and await forward_elsewhere(ctx, ex, name):
        return  # another node's model: served there (--cluster-nodes)
    conv_id = ex.header(b"x-conversation-id") or ""
    owner = tenant_of(ctx.settings, ex.request.key_name)
    if conv_id and owner:  # the child keeps the stream under the owner's id
        headers = ex.request.headers
        for i, (key, _value) in enumerate(headers):
            if key == b"x-conversation-id":
                headers[i] = (key, child_id(conv_id, owner).encode("latin-1"))
    await _serve(ctx, ex, name, update_last_used=True, conv_id=conv_id)


async def handle_proxy_get(ctx: Router, ex: Exchange) -> None:
    name = ex.params.get("model", "")
    # GET does not count as use: a dashboard polling /slots must not keep a model warm.
    await _serve(ctx, ex, name, update_last_used=False)


async def handle_stream_get(ctx: Router, ex: Exchange) -> None:
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
    owner = tenant_of(ctx.settings, ex.request.key_name)
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
