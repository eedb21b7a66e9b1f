"""What every Ollama route shares: its JSON body, its errors (``{"error": "..."}``
with Ollama's status codes), the model a request names, and the lease.

The lease is the OpenAI routes' own (`troupe.lease.Lease`): the same validation
(rejected models, ``?autoload=``), the same queue bounded by ``--queue-timeout``, the
same queue-wait metric; ``keep_alive`` goes to the scheduler as soon as the lease is
held, so the release that follows applies it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from troupe.actors.scheduler import ModelUnavailable
from troupe.api import dumps
from troupe.assembly import Troupe
from troupe.catalog import ModelEntry
from troupe.http.access import begin, finish
from troupe.http.loading import Herald
from troupe.http.respond import retry_after
from troupe.http.server.exchange import Exchange
from troupe.lease import Lease, autoload_flag
from troupe.ollama.keepalive import BadKeepAlive, parse_keep_alive
from troupe.ollama.names import resolve
from troupe.ops.access import AccessRecord
from troupe.proxy.client import RelayReport
from troupe.sched import Failure, Grant

__all__ = [
    "NDJSON",
    "NDJSON_TYPE",
    "Leased",
    "child_headers",
    "describe_keep_alive",
    "keep_alive_of",
    "lease",
    "may_admin",
    "may_use",
    "model_entry",
    "not_found",
    "read_json",
    "refuse_admin",
    "send_error",
]

log = logging.getLogger("troupe.ollama")

NDJSON_TYPE = b"application/x-ndjson"
NDJSON = b"Content-Type: " + NDJSON_TYPE + b"\r\n"


async def send_error(
    ex: Exchange, status: int, message: str, failure: Failure | None = None
) -> None:
    if ex.started:  # a stream whose head went out while its model loaded: Ollama's error line
        line = dumps({"error": message}) + b"\n"
        ex.sent += len(line)
        await ex.send(ex.chunk(line) + ex.last_chunk)
        return
    headers = retry_after(failure) if failure is not None else []
    await ex.respond(status, dumps({"error": message}), headers=headers)


def not_found(name: str) -> str:
    return f'model "{name}" not found, try pulling it first'


async def read_json(ex: Exchange) -> dict[str, Any] | None:
    """The body as a JSON object, or None once a 400 went out (as Ollama answers)."""
    try:
        data = json.loads(ex.body or b"{}")
    except (ValueError, RecursionError) as exc:
        await send_error(ex, 400, f"invalid JSON in the request body: {exc}")
        return None
    if not isinstance(data, dict):
        await send_error(ex, 400, "the request body must be a JSON object")
        return None
    return data


async def model_entry(ctx: Troupe, ex: Exchange, req: Mapping[str, Any]) -> ModelEntry | None:
    """The catalog entry ``model`` (or the older ``name``) names; None once a 400 or
    Ollama's 404 went out."""
    name = req.get("model") or req.get("name")
    if not isinstance(name, str) or not name:
        await send_error(ex, 400, "model is required")
        return None
    entry = resolve(ctx.catalog, name)
    if entry is None or not may_use(ctx, ex, entry):
        await send_error(ex, 404, not_found(name))  # one this key may not use: the same
        return None
    return entry


def may_use(ctx: Troupe, ex: Exchange, entry: ModelEntry) -> bool:
    """Whether the request's key may use ``entry`` (its tenants file's ``models``)."""
    return ctx.tenants.current.allows(ex.request.key_name, (entry.name, *entry.aliases))


def may_admin(ctx: Troupe, ex: Exchange) -> bool:
    """Whether the request's key may pull, delete, load and unload (``admin``)."""
    return ctx.tenants.current.may_admin(ex.request.key_name)


async def refuse_admin(ex: Exchange, action: str) -> None:
    """403 in Ollama's shape: ``action`` needs an admin key."""
    message = f"this API key may not {action}: it needs a tenant with admin = true"
    await send_error(ex, 403, message)


async def keep_alive_of(ex: Exchange, req: Mapping[str, Any]) -> tuple[bool, float | None]:
    """(ok, seconds) for ``keep_alive``; (False, None) once a 400 went out."""
    try:
        return True, parse_keep_alive(req.get("keep_alive"))
    except BadKeepAlive as exc:
        await send_error(ex, 400, str(exc))
        return False, None


Leased = Callable[[Grant, float], Awaitable[None]]  # (the lease, seconds it waited)


async def lease(
    ctx: Troupe,
    ex: Exchange,
    entry: ModelEntry,
    keep_alive: float | None,
    work: Leased,
    tokens: Callable[[AccessRecord], None] | None = None,
    herald: Herald | None = None,
    *,
    written: Callable[[], bool] | None = None,
) -> None:
    """Hold ``entry``'s child for ``work``, exactly as a proxied OpenAI request does
    (`troupe.lease.Lease`); refusals are Ollama's errors with the scheduler's status.
    The request gets its access record like a proxied one (``tokens`` adds what the
    answer counted, before the release, so the tenant's attained service and its budget
    get the engine's own counts). ``herald``: the early head of a stream that waits for a load
    (`troupe.http.loading`), stopped before anything else is written. ``written``: whether
    the whole answer went out (a client that closes after it did not "go away")."""
    rec, began = begin(ctx, ex)
    rec.model, rec.catalogd = entry.name, True
    left = False
    if keep_alive is not None and not may_admin(ctx, ex):
        keep_alive = None  # how long a shared model stays is not a tenant's to say
    try:
        autoload = autoload_flag(ex.params, ctx.settings.models_autoload)
        held = Lease(
            ctx, entry.name, autoload=autoload, keep_alive=keep_alive, record=rec,
            tenant=rec.tenant, body=ex.body,
        )  # fmt: skip
        try:
            async with held:
                if held.rate_fields:  # a tenant with limits: x-ratelimit-* on the answer
                    ex.base += held.rate_fields
                if herald is not None:
                    await herald.settle()
                try:
                    await work(held.grant, held.waited)
                finally:  # before the release: the tenant's attained service reads them
                    if tokens is not None:
                        tokens(rec)
        except ModelUnavailable as exc:  # (the lease set the record's error)
            if herald is not None:
                await herald.settle()
            failure = exc.failure
            await send_error(ex, failure.status, failure.message, failure)
    except trio.Cancelled:
        left = True  # the client went away (its handler is cancelled)
        raise
    finally:
        whole = RelayReport(whole=True) if written is not None and written() else None
        finish(ctx, ex, rec, began, whole, client_left=left)


def describe_keep_alive(seconds: float) -> str:
    return "forever" if math.isinf(seconds) else f"{seconds:g} s"


def child_headers(ex: Exchange, grant: Grant) -> list[tuple[bytes, bytes]]:
    """For the child: JSON, and the client's key (children take the router's keys)."""
    headers = [
        (b"host", f"127.0.0.1:{grant.port}".encode()),
        (b"content-type", b"application/json"),
    ]
    for name in (b"authorization", b"x-api-key"):
        value = ex.header(name)
        if value is not None:
            headers.append((name, value.encode("latin-1")))
    return headers
