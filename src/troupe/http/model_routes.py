"""The router's own model routes, as upstream's: health, props, the model list and its
SSE feed, load, unload, download and removal; the disabled tools routes."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from troupe import __version__
from troupe.actors.scheduler import ModelUnavailable
from troupe.api import dumps
from troupe.assembly import Troupe
from troupe.catalog import ModelEntry
from troupe.catalog.hfcache import split_repo_tag
from troupe.errors import ConfigError
from troupe.http.body_model import OFF_LOOP_BYTES, BadBody, model_from_body
from troupe.http.cluster_forward import cluster_models
from troupe.http.models_json import models_list, settled_downloads
from troupe.http.respond import local_body, send_error, send_failure, send_json, send_stream
from troupe.http.server.exchange import Exchange
from troupe.sched import Failure

__all__ = [
    "disabled",
    "download",
    "health",
    "load",
    "models",
    "models_sse",
    "props",
    "reload",
    "reload_all",
    "remove",
    "sse_event",
    "unload",
]

_HEALTH = dumps({"status": "ok"})
_SUCCESS = {"success": True}
_DISABLED = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}


async def _model_from_json(ex: Exchange) -> str | None:
    """``body.model`` as upstream's ``json_value`` reads it ("" unless a string); None
    once an error went out."""
    raw = await local_body(ex)
    if raw is None:
        return None
    if len(raw) > OFF_LOOP_BYTES:  # scanned in a worker thread, never parsed whole
        try:
            return await model_from_body(raw, None)
        except BadBody as exc:
            await send_error(ex, str(exc), "invalid_request_error")
            return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        await send_error(ex, f"invalid JSON in request body: {exc}", "invalid_request_error")
        return None
    except RecursionError:
        await send_error(
            ex, "invalid JSON in request body: nested too deeply", "invalid_request_error"
        )
        return None
    value = data.get("model") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


async def health(router: Troupe, ex: Exchange) -> None:
    await ex.respond(200, _HEALTH)


async def props(router: Troupe, ex: Exchange) -> None:
    s = router.settings
    await send_json(
        ex,
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
        },
    )


def _may_use(router: Troupe, ex: Exchange, name: str) -> bool:
    """Whether the request's key may use model ``name`` (a catalog name or alias, or
    a download's): its tenants file's ``models``."""
    entry = router.catalog.get(name)
    names = (name,) if entry is None else (entry.name, *entry.aliases)
    return router.tenants.current.allows(ex.request.key_name, names)


def _visible(router: Troupe, ex: Exchange, entry: ModelEntry | None) -> ModelEntry | None:
    """``entry``, or None when the request's key may not use it (then it is unknown)."""
    if entry is None or _may_use(router, ex, entry.name):
        return entry
    return None


async def _admin(router: Troupe, ex: Exchange, action: str) -> bool:
    """Whether the request's key may do an admin action; False once its 403 went out."""
    if router.tenants.current.may_admin(ex.request.key_name):
        return True
    message = f"this API key may not {action}: it needs a tenant with admin = true"
    await send_error(ex, message, "permission_error")
    return False


async def reload_all(router: Troupe) -> tuple[Failure | None, str | None]:
    """Read the tenants file again and reload the catalog (``SIGHUP``,
    ``POST /models/reload``): (the catalog's failure, why the tenants file was kept),
    None for each that went through. One does not stop the other."""
    kept = router.tenants.reload()
    try:
        await router.scheduler.reload()
    except ModelUnavailable as exc:
        return exc.failure, kept
    return None, kept


async def reload(router: Troupe, ex: Exchange) -> None:
    """``POST /models/reload``: the catalog and the tenants file (admin only)."""
    if not await _admin(router, ex, "reload"):
        return
    failure, kept = await reload_all(router)
    if failure is not None:
        await send_failure(ex, failure)
    elif kept is not None:
        message = f"the model catalog was reloaded; the tenants file was kept as it was: {kept}"
        await send_error(ex, message, "invalid_request_error")
    else:
        await send_json(ex, _SUCCESS)


async def models(router: Troupe, ex: Exchange) -> None:
    if ex.params.get("reload", ""):
        if not await _admin(router, ex, "reload"):
            return
        failure, _kept = await reload_all(router)  # (a kept tenants file is logged)
        if failure is not None:
            await send_failure(ex, failure)
            return
    await settled_downloads(router)
    doc = models_list(router, int(time.time()), ex.request.key_name)
    if router.cluster is not None:
        doc = await cluster_models(router, ex, doc)  # every node's (--cluster-nodes)
    await send_json(ex, doc)


async def load(router: Troupe, ex: Exchange) -> None:
    if not await _admin(router, ex, "load models"):
        return
    name = await _model_from_json(ex)
    if name is None:
        return
    entry = _visible(router, ex, router.catalog.resolve(name))
    scheduler = router.scheduler
    if entry is None and name in scheduler.snapshot.downloads and _may_use(router, ex, name):
        await send_json(ex, _SUCCESS)  # upstream: not unloaded, so nothing to do
        return
    if entry is None:
        await send_error(ex, "model is not found", "not_found_error")
        return
    rejected = router.rejection(entry)
    if rejected:
        message = f"model '{entry.name}' cannot be served: {rejected}"
        await send_error(ex, message, "invalid_request_error")
        return
    try:  # the scheduler answers "model is already running" (and sleeps for fake timing)
        await scheduler.load(entry.name)
    except ModelUnavailable as exc:
        await send_failure(ex, exc.failure)
        return
    await send_json(ex, _SUCCESS)


async def unload(router: Troupe, ex: Exchange) -> None:
    if not await _admin(router, ex, "unload models"):
        return
    name = await _model_from_json(ex)
    if name is None:
        return
    entry = _visible(router, ex, router.catalog.resolve(name))
    downloading = name in router.scheduler.snapshot.downloads and _may_use(router, ex, name)
    if entry is None and not downloading:
        await send_error(ex, "model is not found", "invalid_request_error")
        return
    try:  # a download: answered once its job has ended (as upstream)
        await router.scheduler.unload(name if entry is None else entry.name)
    except ModelUnavailable as exc:
        await send_failure(ex, exc.failure)
        return
    await send_json(ex, _SUCCESS)


def sse_event(event: dict[str, Any]) -> bytes:
    """One scheduler event as an SSE ``data:`` line (the one place it is serialised)."""
    return b"data: " + dumps(event) + b"\n\n"


async def models_sse(router: Troupe, ex: Exchange) -> None:
    # A cluster node names itself in every event (its name as the balancer knows it).
    node = await router.cluster.name() if router.cluster is not None else None

    async def events() -> AsyncGenerator[bytes, None]:
        with router.scheduler.subscribe() as channel:
            async for event in channel:
                model = event.get("model")
                if isinstance(model, str) and not _may_use(router, ex, model):
                    continue  # a model this key may not use: as if it did not exist
                yield sse_event(event if node is None else {**event, "node": node})

    await send_stream(ex, b"X-Accel-Buffering: no\r\n", events())


async def download(router: Troupe, ex: Exchange) -> None:
    if not await _admin(router, ex, "download models"):
        return
    name = await _model_from_json(ex)
    if name is None:
        return
    if not name:
        await send_error(ex, "model must be a non-empty string", "invalid_request_error")
        return
    try:
        split_repo_tag(name)
    except ConfigError as exc:
        await send_error(ex, f"{exc}\n", "invalid_request_error")  # upstream's ends with \n
        return
    scheduler = router.scheduler
    if router.catalog.resolve(name) is not None or name in scheduler.snapshot.downloads:
        await send_error(ex, f"model '{name}' already exists", "invalid_request_error")
        return
    plan, why, status = await router.downloads.plan(name)
    try:
        await scheduler.start_download(name, plan, why, status)
    except ModelUnavailable as exc:
        await send_failure(ex, exc.failure)
        return
    await send_json(ex, _SUCCESS)


async def remove(router: Troupe, ex: Exchange) -> None:
    if not await _admin(router, ex, "delete models"):
        return
    name = ex.params.get("model", "")
    if not name:
        await send_error(ex, "model must be a non-empty string", "invalid_request_error")
        return
    if not _may_use(router, ex, name):  # one this key may not use: the core's words
        await send_failure(ex, Failure.server_error(f"model name={name} is not found"))
        return
    try:
        await router.scheduler.remove(name)
    except ModelUnavailable as exc:
        await send_failure(ex, exc.failure)
        return
    await send_json(ex, _SUCCESS)


async def disabled(router: Troupe, ex: Exchange) -> None:
    await send_json(ex, _DISABLED, 403)
