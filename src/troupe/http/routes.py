"""The router's own routes (not proxied), on a quart-trio app (spec §3.2-§3.4, §7)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from troupe import __version__
from troupe.actors.scheduler import ModelUnavailable
from troupe.catalog.hfcache import split_repo_tag
from troupe.errors import ConfigError
from troupe.http.errors import JSON_TYPE, dumps, error_body, failure_body, status_of
from troupe.http.models_json import models_list, settled_downloads
from troupe.http.streams import register_stream_routes
from troupe.ops.routes import register_ops_routes
from troupe.router import Router
from troupe.sched import Failure
from troupe.sched.base import FAKE_TIMING_DELAY

__all__ = ["create_local_app"]


def _json(value: Any, status: int = 200) -> Response:
    return Response(dumps(value), status=status, content_type=JSON_TYPE)


def _error(message: str, type_: str) -> Response:
    return Response(error_body(message, type_), status=status_of(type_), content_type=JSON_TYPE)


def _failure(failure: Failure) -> Response:
    response = Response(failure_body(failure), status=failure.status, content_type=JSON_TYPE)
    if failure.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(failure.retry_after)))
    return response


async def _model_from_json() -> str | Response:
    """``body.model`` as upstream's ``json_value`` reads it ("" unless a string)."""
    raw = await request.get_data(as_text=False)
    try:
        data = json.loads(raw if isinstance(raw, str) else raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return _error(f"invalid JSON in request body: {exc}", "invalid_request_error")
    value = data.get("model") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


def create_local_app(ctx: Router) -> QuartTrio:
    app = QuartTrio("troupe")
    app.config.update(
        RESPONSE_TIMEOUT=None,  # SSE streams live as long as their client
        BODY_TIMEOUT=float(ctx.settings.timeout),
        MAX_CONTENT_LENGTH=16 << 20,  # router-local bodies are small JSON documents
        BACKGROUND_TASK_SHUTDOWN_TIMEOUT=1,
    )
    prefix = ctx.settings.api_prefix

    @app.get(prefix + "/health")
    @app.get(prefix + "/v1/health")
    async def health() -> Response:
        return _json({"status": "ok"})

    @app.get(prefix + "/props")
    async def props() -> Response:
        s = ctx.settings
        return _json(
            {
                "role": "router",
                "max_instances": s.models_max,
                "models_autoload": s.models_autoload,
                "model_alias": "llama-server",
                "model_path": "none",
                "default_generation_settings": {"params": None, "n_ctx": 0},
                "ui_settings": dict(s.ui_config),
                "build_info": f"b0-troupe-{__version__}",
                "cors_proxy_enabled": s.ui_mcp_proxy,
            }
        )

    @app.get(prefix + "/models")
    @app.get(prefix + "/v1/models")
    async def models() -> Response:
        if request.args.get("reload", ""):
            try:
                await ctx.scheduler.reload()
            except ModelUnavailable as exc:
                return _failure(exc.failure)
        await settled_downloads(ctx)
        return _json(models_list(ctx, int(time.time())))

    @app.post(prefix + "/models/load")
    async def load() -> Response:
        name = await _model_from_json()
        if isinstance(name, Response):
            return name
        entry = ctx.catalog.resolve(name)
        if entry is None and name in ctx.scheduler.snapshot.downloads:
            return _json({"success": True})  # upstream: not unloaded, so nothing to do
        if entry is None:
            return _error("model is not found", "not_found_error")
        rejected = ctx.rejection(entry)
        if rejected:
            return _error(
                f"model '{entry.name}' cannot be served: {rejected}", "invalid_request_error"
            )
        view = ctx.scheduler.snapshot.models.get(entry.name)
        if view is not None and view.status.is_running:
            return _error("model is already running", "invalid_request_error")
        if ctx.fake_timing:
            await trio.sleep(FAKE_TIMING_DELAY)
        try:
            await ctx.scheduler.load(entry.name)
        except ModelUnavailable as exc:
            return _failure(exc.failure)
        return _json({"success": True})

    @app.post(prefix + "/models/unload")
    async def unload() -> Response:
        name = await _model_from_json()
        if isinstance(name, Response):
            return name
        entry = ctx.catalog.resolve(name)
        if entry is None and name in ctx.scheduler.snapshot.downloads:
            try:  # a download: answered once its job has ended (§3.4)
                await ctx.scheduler.unload(name)
            except ModelUnavailable as exc:
                return _failure(exc.failure)
            return _json({"success": True})
        if entry is None:
            return _error("model is not found", "invalid_request_error")
        try:
            await ctx.scheduler.unload(entry.name)
        except ModelUnavailable as exc:
            return _failure(exc.failure)
        return _json({"success": True})

    @app.get(prefix + "/models/sse")
    async def models_sse() -> Response:
        async def events() -> AsyncIterator[bytes]:
            with ctx.scheduler.subscribe() as channel:
                async for event in channel:
                    yield b"data: " + dumps(event) + b"\n\n"

        response = Response(events(), content_type="text/event-stream")
        response.timeout = None
        response.headers["X-Accel-Buffering"] = "no"
        return response

    @app.post(prefix + "/models")
    async def download() -> Response:
        name = await _model_from_json()
        if isinstance(name, Response):
            return name
        if not name:
            return _error("model must be a non-empty string", "invalid_request_error")
        try:
            split_repo_tag(name)
        except ConfigError as exc:
            return _error(f"{exc}\n", "invalid_request_error")  # upstream's ends with a newline
        if ctx.catalog.resolve(name) is not None or name in ctx.scheduler.snapshot.downloads:
            return _error(f"model '{name}' already exists", "invalid_request_error")
        plan, why, status = await ctx.downloads.plan(name)
        try:
            await ctx.scheduler.start_download(name, plan, why, status)
        except ModelUnavailable as exc:
            return _failure(exc.failure)
        return _json({"success": True})

    @app.delete(prefix + "/models")
    async def remove() -> Response:
        name = request.args.get("model", "")
        if not name:
            return _error("model must be a non-empty string", "invalid_request_error")
        try:
            await ctx.scheduler.remove(name)
        except ModelUnavailable as exc:
            return _failure(exc.failure)
        return _json({"success": True})

    @app.route(prefix + "/tools", methods=["GET", "POST"])
    @app.route(prefix + "/cors-proxy", methods=["GET", "POST"])
    async def disabled() -> Response:
        return _json(
            {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}, 403
        )

    register_stream_routes(app, ctx)
    register_ops_routes(app, ctx)  # /metrics, /logs/stream, the dashboard
    return app
