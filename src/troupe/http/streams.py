"""Resumable-stream routes: find the child that owns a conversation (spec §10)."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from urllib.parse import quote

import httpx
from quart import Response, request
from quart_trio import QuartTrio

from troupe.http.context import RouterContext
from troupe.http.errors import JSON_TYPE, dumps, error_body
from troupe.sched import ModelView, Status

__all__ = ["owner_of", "register_stream_routes"]

LOOKUP_TIMEOUT = 0.25  # seconds, upstream's STREAM_LOOKUP_TIMEOUT_MS


def owner_of(ctx: RouterContext, conv_id: str) -> ModelView | None:
    """The loaded model serving ``conv_id``, if any."""
    model = ctx.conversations.lookup(conv_id) if conv_id else None
    view = ctx.scheduler.snapshot.models.get(model) if model else None
    return view if view is not None and view.status is Status.LOADED else None


def _error(message: str, type_: str, status: int) -> Response:
    return Response(error_body(message, type_), status=status, content_type=JSON_TYPE)


def register_stream_routes(app: QuartTrio, ctx: RouterContext) -> None:
    prefix = ctx.settings.api_prefix
    client = httpx.AsyncClient(timeout=httpx.Timeout(LOOKUP_TIMEOUT))

    @app.after_serving
    async def close_client() -> None:
        await client.aclose()

    @app.post(prefix + "/v1/streams/lookup")
    async def streams_lookup() -> Response:
        try:
            body = json.loads(await request.get_data(as_text=True))
        except ValueError:
            return Response(b"[]", content_type=JSON_TYPE)
        ids = body.get("conversation_ids") if isinstance(body, dict) else None
        per_port: dict[int, list[str]] = {}
        for cid in ids if isinstance(ids, list) else []:
            if isinstance(cid, str) and cid:
                owner = owner_of(ctx, cid)
                if owner is not None:
                    per_port.setdefault(owner.port, []).append(cid)
        found: list[Any] = []
        for port, group in per_port.items():
            try:
                resp = await client.post(
                    f"http://127.0.0.1:{port}/v1/streams/lookup", json={"conversation_ids": group}
                )
                items = resp.json() if resp.status_code == 200 else []
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(items, list):
                found += [item for item in items if isinstance(item, dict)]
        return Response(dumps(found), content_type=JSON_TYPE)

    @app.delete(prefix + "/v1/stream")
    async def stream_delete() -> Response:
        conv_id = request.args.get("conv_id", "")
        if not conv_id:
            return _error("Missing conversation id in path", "invalid_request_error", 400)
        owner = owner_of(ctx, conv_id)
        if owner is not None:
            url = f"http://127.0.0.1:{owner.port}/v1/stream?conv_id={quote(conv_id, safe='')}"
            with contextlib.suppress(httpx.HTTPError):  # the child logs its own miss
                await client.delete(url)
        ctx.conversations.forget(conv_id)  # also cancels a request parked in a load wait
        return Response(b"", status=204, content_type="application/json")
