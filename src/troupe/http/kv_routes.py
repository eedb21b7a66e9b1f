"""The node-to-node KV routes (`troupe.cluster.kvsync`): a peer's push of a slot file
and its fetch of one. The front admits them only with a node's own signed mark
(`Front.admit`); here they only translate to the KV store's `Replicas`."""

from __future__ import annotations

import json

from troupe.api import dumps
from troupe.assembly import Troupe
from troupe.cluster.kvsync import KV_SEAL, KV_SHA256, seal_parts
from troupe.http.errors import NOT_FOUND_BODY, error_body
from troupe.http.server.exchange import Exchange
from troupe.kvstore.replicas import Refused, Replicas

__all__ = ["kv_fetch", "kv_push"]

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}


def _replicas(ctx: Troupe) -> Replicas | None:
    return ctx.kv.replicas if ctx.kv is not None else None


async def kv_push(ctx: Troupe, ex: Exchange) -> None:
    """A peer's slot file, stored as the KV store's own (`Replicas.receive`)."""
    replicas = _replicas(ctx)
    if replicas is None:
        await ex.respond(404, NOT_FOUND_BODY)
        return
    p = ex.params
    model, ident, tenant = p.get("model", ""), p.get("ident", ""), p.get("tenant", "")
    try:
        entry = await replicas.receive(model, ident, tenant, p.get("sha256", ""), ex.body)
    except Refused as exc:
        await ex.respond(exc.status, error_body(str(exc), _TYPES.get(exc.status, "server_error")))
        return
    await ex.respond(200, dumps({"stored": entry.name, "tokens": len(entry.tokens)}))


async def kv_fetch(ctx: Troupe, ex: Exchange) -> None:
    """This node's file for a peer's prompt tokens, of the same identity and tenant."""
    replicas = _replicas(ctx)
    cluster = ctx.cluster
    if replicas is None or cluster is None:
        await ex.respond(404, NOT_FOUND_BODY)
        return
    p = ex.params
    try:
        tokens = json.loads(ex.body)["tokens"]
        better = int(p.get("better", "0"))
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):
        message = 'expected {"tokens": [integers]} and ?better=N'
        await ex.respond(400, error_body(message, "invalid_request_error"))
        return
    ident, tenant = p.get("ident", ""), p.get("tenant", "")
    entry = replicas.offer(ident, tenant, tokens, better)
    data = None if entry is None else await replicas.read(entry)
    if entry is None or data is None:
        await ex.respond(404, NOT_FOUND_BODY)
        return
    seal = cluster.trust.seal(*seal_parts(ident, tenant, entry.sha256))
    headers = [(KV_SHA256, entry.sha256.encode()), (KV_SEAL, seal.encode())]
    await ex.respond(200, data, "application/octet-stream", headers)
