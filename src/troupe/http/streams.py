"""Resumable-stream routes: find the child that owns a conversation (``/v1/stream``).

Every request to a child goes through a lease on it (so it cannot be evicted while
asked) and the one pooled transport, with upstream's 250 ms bounds. A conversation
belongs to the tenant that started it (`troupe.http.keys.tenant_of`): another tenant's
id is looked up, stopped and answered exactly as an unknown one.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import trio

from troupe.api import JSON_TYPE, dumps
from troupe.assembly import Troupe
from troupe.conversations import child_id, from_child_id
from troupe.http.cluster_forward import ask_every_peer
from troupe.http.keys import tenant_of
from troupe.http.respond import local_body, send_error
from troupe.http.server.exchange import Exchange

__all__ = ["LOOKUP_TIMEOUT", "stream_delete", "streams_lookup"]

LOOKUP_TIMEOUT = 0.25  # seconds, upstream's STREAM_LOOKUP_TIMEOUT_MS
_JSON = ((b"content-type", b"application/json"),)


async def _lookup_in(
    router: Troupe, model: str, ids: list[str], owner: str, found: list[Any]
) -> None:
    async with router.scheduler.lease_if_ready(model) as grant:
        if grant is None:
            return
        body = dumps({"conversation_ids": [child_id(cid, owner) for cid in ids]})
        answer = None
        with trio.move_on_after(LOOKUP_TIMEOUT):
            answer = await router.relay.fetch(grant, "POST", "/v1/streams/lookup", body, _JSON)
    if answer is None or answer[0] != 200:
        return
    try:
        items = json.loads(answer[1])
    except ValueError:
        return
    if isinstance(items, list):
        found += [_as_client(item, owner) for item in items if isinstance(item, dict)]


def _as_client(item: dict[str, Any], owner: str) -> dict[str, Any]:
    """A child's lookup item with the client's own conversation id."""
    cid = item.get("conversation_id")
    if not owner or not isinstance(cid, str):
        return item
    return {**item, "conversation_id": from_child_id(cid, owner) or cid}


async def streams_lookup(router: Troupe, ex: Exchange) -> None:
    raw = await local_body(ex)
    if raw is None:
        return
    try:
        body = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        await ex.respond(200, b"[]")
        return
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    per_model: dict[str, list[str]] = {}
    owner = tenant_of(router.tenants.current, ex.request.key_name)
    for cid in ids if isinstance(ids, list) else []:
        if isinstance(cid, str) and cid:
            model = router.conversations.lookup(cid, owner=owner)
            if model is not None:
                per_model.setdefault(model, []).append(cid)
    found: list[Any] = []
    async with trio.open_nursery() as nursery:
        for model, group in sorted(per_model.items()):
            nursery.start_soon(_lookup_in, router, model, group, owner, found)
    if router.cluster is not None:  # the other nodes' conversations (--cluster-nodes)
        found += _peer_items(await ask_every_peer(router, ex, LOOKUP_TIMEOUT * 2))
    await ex.respond(200, dumps(found), JSON_TYPE)


def _peer_items(answers: list[bytes]) -> list[Any]:
    items: list[Any] = []
    for raw in answers:
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, list):
            items += [item for item in value if isinstance(item, dict)]
    return items


async def stream_delete(router: Troupe, ex: Exchange) -> None:
    conv_id = ex.params.get("conv_id", "")
    if not conv_id:
        await send_error(ex, "Missing conversation id in path", "invalid_request_error")
        return
    owner = tenant_of(router.tenants.current, ex.request.key_name)
    model = router.conversations.lookup(conv_id, owner=owner)
    # Also cancels a request parked in a load wait (the owner's only).
    router.conversations.forget(conv_id, owner=owner)
    if model is not None:
        async with router.scheduler.lease_if_ready(model) as grant:
            if grant is not None:  # the child logs its own miss; the answer is ignored
                target = f"/v1/stream?conv_id={quote(child_id(conv_id, owner), safe='')}"
                with trio.move_on_after(LOOKUP_TIMEOUT):
                    await router.relay.fetch(grant, "DELETE", target, b"", _JSON)
    elif router.cluster is not None:  # held by another node, if any (--cluster-nodes)
        await ask_every_peer(router, ex, LOOKUP_TIMEOUT * 2)
    await ex.respond(204, b"", "application/json")
