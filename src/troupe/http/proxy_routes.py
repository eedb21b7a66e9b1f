"""Proxied routes: find the model a request names, lease its child, relay (spec §3.5)."""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import trio
from werkzeug.formparser import MultiPartParser
from werkzeug.http import parse_options_header

from troupe.actors.scheduler import ModelUnavailable
from troupe.catalog import ModelEntry
from troupe.http.asgi import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    header,
    query_params,
    read_body,
    send_response,
    until_disconnect,
)
from troupe.http.context import RouterContext
from troupe.http.errors import dumps, error_body, failure_body
from troupe.proxy.relay import ChildLost
from troupe.sched import Failure, Grant, Snapshot, Status
from troupe.sched.base import FAKE_TIMING_DELAY

__all__ = [
    "BadRequest",
    "acquire_within",
    "autoload_flag",
    "handle_proxy_get",
    "handle_proxy_post",
    "handle_stream_get",
    "model_from_body",
    "retry_after",
    "validate_model",
]

log = logging.getLogger("troupe.http")


class BadRequest(Exception):
    pass


def autoload_flag(scope: Scope, default: bool) -> bool:
    """``?autoload=``: empty means the server setting; else true only for "true" or "1"."""
    value = query_params(scope).get("autoload", "")
    return default if value == "" else value in ("true", "1")


def model_from_body(body: bytes, content_type: str | None) -> str:
    """The ``model`` field of a JSON body or a multipart form; "" when absent or not a string."""
    mime, options = parse_options_header(content_type or "")
    if mime == "multipart/form-data":
        boundary = options.get("boundary", "").encode("latin-1")
        if not boundary:
            raise BadRequest("multipart body without a boundary")
        try:
            form, files = MultiPartParser().parse(io.BytesIO(body), boundary, len(body))
        except ValueError as exc:
            raise BadRequest(f"invalid multipart body: {exc}") from None
        for upload in files.values():
            upload.close()  # only the form fields matter here; the child gets the raw body
        value = form.get("model", "")
        return value if isinstance(value, str) else ""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadRequest(f"invalid JSON in request body: {exc}") from None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else ""


def validate_model(ctx: RouterContext, name: str, autoload: bool) -> ModelEntry | Failure:
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


async def _send_failure(send: Send, failure: Failure) -> None:
    await send_response(send, failure.status, failure_body(failure), headers=retry_after(failure))


def retry_after(failure: Failure) -> list[tuple[bytes, bytes]]:
    if failure.retry_after is None:
        return []
    return [(b"retry-after", str(max(1, math.ceil(failure.retry_after))).encode())]


async def acquire_within(
    ctx: RouterContext, model: str, *, autoload: bool, update_last_used: bool
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


def _crash_detail(ctx: RouterContext, model: str) -> Callable[[], Awaitable[str | None]]:
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


async def _serve(
    ctx: RouterContext,
    scope: Scope,
    receive: Receive,
    send: Send,
    name: str,
    body: bytes,
    *,
    update_last_used: bool,
    conv_id: str = "",
) -> None:
    autoload = autoload_flag(scope, ctx.settings.models_autoload)
    checked = validate_model(ctx, name, autoload)
    if isinstance(checked, Failure):
        await _send_failure(send, checked)
        return
    lost: list[ChildLost] = []

    async def work() -> None:
        try:
            await _lease_and_relay(
                ctx, scope, send, checked, body, autoload, update_last_used, conv_id
            )
        except ChildLost as exc:
            lost.append(exc)

    # A client that goes away cancels its wait (it leaves the queue) or its relay (the
    # child stops generating); hypercorn only tells a plain ASGI app through receive().
    await until_disconnect(receive, work)
    if lost:
        raise lost[0]  # a response already started can only be aborted


async def _lease_and_relay(
    ctx: RouterContext,
    scope: Scope,
    send: Send,
    entry: ModelEntry,
    body: bytes,
    autoload: bool,
    update_last_used: bool,
    conv_id: str,
) -> None:
    scheduler = ctx.scheduler
    tracker = ctx.conversations
    # Registered before the wait, so a stop issued while the model loads can cancel it.
    ticket = tracker.remember(conv_id, entry.name) if conv_id else 0
    try:
        # A conversation's wait ignores the client going away (a page reload must not
        # cancel the load); only a stop of the conversation cancels it (§6.6).
        with (
            trio.CancelScope(shield=bool(ticket)) as wait_scope,
            ctx.metrics.time_queue_wait(entry.name),
        ):
            if ticket:
                tracker.attach(conv_id, ticket, wait_scope)
            rid, grant = await acquire_within(
                ctx, entry.name, autoload=autoload, update_last_used=update_last_used
            )
    except ModelUnavailable as exc:
        await _send_failure(send, exc.failure)
        return
    finally:
        if ticket:
            tracker.detach(conv_id, ticket)
    if ticket and (wait_scope.cancelled_caught or not tracker.alive(conv_id, ticket)):
        if not wait_scope.cancelled_caught:
            await scheduler.release(rid)
        msg = "request cancelled by a stop while the model was loading"
        await _send_failure(send, Failure.bad_request(msg))
        return
    try:
        if ctx.fake_timing:
            await trio.sleep(FAKE_TIMING_DELAY)  # counted busy meanwhile, like upstream
        await ctx.relay.relay(
            scope,
            send,
            child=grant,
            body=body,
            detached=bool(ticket) and grant.waited,
            crash_detail=_crash_detail(ctx, grant.model),
        )
    finally:
        await scheduler.release(rid)


async def handle_proxy_post(ctx: RouterContext, scope: Scope, receive: Receive, send: Send) -> None:
    try:
        body = await read_body(receive, ctx.settings.max_body_bytes)
    except ClientGone:
        return
    except BodyTooLarge:
        limit = ctx.settings.max_body_bytes
        msg = f"request body is larger than the limit of {limit} bytes"
        await send_response(
            send,
            413,
            dumps({"error": {"code": 413, "message": msg, "type": "invalid_request_error"}}),
        )
        return
    try:
        name = model_from_body(body, header(scope, b"content-type"))
    except BadRequest as exc:
        await send_response(send, 400, error_body(str(exc), "invalid_request_error"))
        return
    conv_id = header(scope, b"x-conversation-id") or ""
    await _serve(ctx, scope, receive, send, name, body, update_last_used=True, conv_id=conv_id)


async def handle_proxy_get(ctx: RouterContext, scope: Scope, receive: Receive, send: Send) -> None:
    name = query_params(scope).get("model", "")
    # GET does not count as use: a dashboard polling /slots must not keep a model warm.
    await _serve(ctx, scope, receive, send, name, b"", update_last_used=False)


async def handle_stream_get(ctx: RouterContext, scope: Scope, receive: Receive, send: Send) -> None:
    """``GET /v1/stream?conv_id=&from=``: replay from the child that owns the conversation,
    under a lease (the child cannot be evicted mid-replay), stopped if the client leaves."""
    params = query_params(scope)
    conv_id = params.get("conv_id", "")
    if not conv_id:
        await send_response(
            send, 400, error_body("Missing conversation id in path", "invalid_request_error")
        )
        return
    model = ctx.conversations.lookup(conv_id)
    path = f"/v1/stream?conv_id={quote(conv_id, safe='')}"
    if params.get("from"):
        path += f"&from={quote(params['from'], safe='')}"

    async def work() -> None:
        async with ctx.scheduler.lease_if_ready(model or "") as grant:
            if grant is not None:
                await ctx.relay.relay(scope, send, child=grant, body=b"", method="GET", path=path)
                return
        view = ctx.scheduler.snapshot.models.get(model) if model else None
        if view is not None and view.status in (
            Status.LOADING,
            Status.DOWNLOADING,
            Status.DOWNLOADED,
        ):
            body = error_body("Stream owner model is loading, retry later", "unavailable_error")
            await send_response(send, 503, body)
        else:
            await send_response(
                send, 404, error_body("Stream not found or expired", "not_found_error")
            )

    lost: list[ChildLost] = []

    async def guarded() -> None:
        try:
            await work()
        except ChildLost as exc:
            lost.append(exc)

    await until_disconnect(receive, guarded)
    if lost:
        raise lost[0]
