"""Resumable-stream routes: find the child that owns a conversation (spec §10).

Every request to a child goes through a lease on it (so it cannot be evicted while
asked) and the one pooled transport, with upstream's 250 ms bounds.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import trio
from quart import Response, request
from quart_trio import QuartTrio

from troupe.http.errors import JSON_TYPE, dumps, error_body
from troupe.router import Router

__all__ = ["register_stream_routes"]

LOOKUP_TIMEOUT = 0.25  # seconds, upstream's STREAM_LOOKUP_TIMEOUT_MS
_SCOPE: dict[str, Any] = {"headers": [(b"content-type", b"application/json")]}


def _error(message: str, type_: str, status: int) -> Response:
    return Response(error_body(message, type_), status=status, content_type=JSON_TYPE)


def register_stream_routes(app: QuartTrio, ctx: Router) -> None:
    prefix = ctx.settings.api_prefix

    async def lookup_in(model: str, ids: list[str], found: list[Any]) -> None:
        async with ctx.scheduler.lease_if_ready(model) as grant:
            if grant is None:
                return
            body = dumps({"conversation_ids": ids})
            answer = None
            with trio.move_on_after(LOOKUP_TIMEOUT):
                answer = await ctx.relay.fetch(_SCOPE, grant, "POST", "/v1/streams/lookup", body)
        if answer is None or answer[0] != 200:
            return
        try:
            items = json.loads(answer[1])
        except ValueError:
            return
        if isinstance(items, list):
            found += [item for item in items if isinstance(item, dict)]

    @app.post(prefix + "/v1/streams/lookup")
    async def streams_lookup() -> Response:
        try:
            body = json.loads(await request.get_data(as_text=True))
        except (ValueError, RecursionError):
            return Response(b"[]", content_type=JSON_TYPE)
        ids = body.get("conversation_ids") if isinstance(body, dict) else None
        per_model: dict[str, list[str]] = {}
        for cid in ids if isinstance(ids, list) else []:
            if isinstance(cid, str) and cid:
                model = ctx.conversations.lookup(cid)
                if model is not None:
                    per_model.setdefault(model, []).append(cid)
        found: list[Any] = []
        async with trio.open_nursery() as nursery:
            for model, group in sorted(per_model.items()):
                nursery.start_soon(lookup_in, model, group, found)
        return Response(dumps(found), content_type=JSON_TYPE)

    @app.delete(prefix + "/v1/stream")
    async def stream_delete() -> Response:
        conv_id = request.args.get("conv_id", "")
        if not conv_id:
            return _error("Missing conversation id in path", "invalid_request_error", 400)
        model = ctx.conversations.lookup(conv_id)
        ctx.conversations.forget(conv_id)  # also cancels a request parked in a load wait
        if model is not None:
            async with ctx.scheduler.lease_if_ready(model) as grant:
                if grant is not None:  # the child logs its own miss; the answer is ignored
                    target = f"/v1/stream?conv_id={quote(conv_id, safe='')}"
                    with trio.move_on_after(LOOKUP_TIMEOUT):
                        await ctx.relay.fetch(_SCOPE, grant, "DELETE", target, b"")
        return Response(b"", status=204, content_type="application/json")
