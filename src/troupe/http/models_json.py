"""The ``GET /models`` document (spec §3.3), plus troupe's facts under one extra key."""

from __future__ import annotations

from typing import Any

from troupe.catalog import ModelEntry
from troupe.catalog.facts import facts_json
from troupe.hardware.feasibility import feasibility
from troupe.http.context import RouterContext
from troupe.sched import ModelView

__all__ = ["EXTRA_KEY", "model_item", "models_list"]

EXTRA_KEY = "troupe"  # upstream clients ignore unknown keys; everything of ours lives here


def _architecture(entry: ModelEntry, view: ModelView | None) -> dict[str, list[str]]:
    arch = entry.architecture.to_json()
    info = view.loaded_info if view is not None else None
    child_arch = info.get("architecture") if isinstance(info, dict) else None
    if isinstance(child_arch, dict):
        # The child's arrays replace ours, each only when it is a list of strings.
        for key in ("input_modalities", "output_modalities"):
            value = child_arch.get(key)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                arch[key] = value
    return arch


def _extras(view: ModelView | None, now: float) -> dict[str, Any]:
    if view is None:
        return {}
    held = None
    if view.held_until is not None and view.held_until > now:
        held = round(view.held_until - now, 1)
    return {
        "port": view.port or None,
        "pid": view.pid or None,
        "stopping": view.stopping,
        "in_flight": view.in_flight,
        "waiting": view.waiting,
        "queue_position": view.queue_position,
        "wait_reason": view.wait_reason,
        "draining_for": view.draining_for,
        "last_load_seconds": view.last_load_seconds,
        "last_eviction": view.last_eviction,
        "last_error": view.last_error,
        "held_back_seconds": held,
        "pin": view.pin,
        "ttl": view.ttl,
    }


def _memory(ctx: RouterContext, view: ModelView | None) -> dict[str, Any] | None:
    need = view.memory_need if view is not None else None
    if not need:
        return None
    report = feasibility(
        sum(need.values()),
        ram_total=ctx.devices.host.total,
        gpu_totals=[g.total for g in ctx.devices.gpus],
    )
    return {
        "need_bytes": dict(need),
        "used_bytes": dict(view.memory_used) if view and view.memory_used else None,
        "feasibility": str(report.colour),
        "why": report.explain(),
    }


def model_item(ctx: RouterContext, entry: ModelEntry, created: int, now: float) -> dict[str, Any]:
    view = ctx.scheduler.snapshot.models.get(entry.name)
    status: dict[str, Any] = {
        "value": str(view.status) if view else "unloaded",
        "args": ctx.status_args(entry),
        "preset": ctx.catalog.status_preset(entry),
    }
    if view is not None and view.failed:
        status["exit_code"] = view.exit_code
        status["failed"] = True
    item: dict[str, Any] = {
        "id": entry.name,
        "aliases": list(entry.sorted_aliases),
        "tags": list(entry.sorted_tags),
        "object": "model",
        "owned_by": "llamacpp",
        "created": created,
        "status": status,
        "architecture": _architecture(entry, view),
        "source": str(entry.source),
        "can_remove": entry.can_remove,
    }
    if view is not None and view.status.is_running and isinstance(view.loaded_info, dict):
        for key, value in view.loaded_info.items():
            item.setdefault(key, value)
    extras = _extras(view, now)
    extras["gguf"] = facts_json(ctx.facts.facts(entry.model_path))
    extras["memory"] = _memory(ctx, view)
    item[EXTRA_KEY] = extras
    return item


def models_list(ctx: RouterContext, created: int) -> dict[str, Any]:
    import trio  # noqa: PLC0415

    now = trio.current_time()
    data = [model_item(ctx, e, created, now) for e in ctx.catalog.visible()]
    return {"data": data, "object": "list"}
