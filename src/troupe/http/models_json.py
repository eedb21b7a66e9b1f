"""The ``GET /models`` document (upstream's), plus troupe's facts under one extra key."""

from __future__ import annotations

from typing import Any

import trio

from troupe.assembly import Troupe
from troupe.catalog import ModelEntry
from troupe.catalog.facts import facts_json, file_bytes
from troupe.catalog.figure import child_context
from troupe.hardware.cpus import format_cpus
from troupe.hardware.feasibility import feasibility
from troupe.ops.load_log import load_percent
from troupe.sched import ModelView, Snapshot, Status
from troupe.sched.downloads import DownloadView

__all__ = [
    "EXTRA_KEY",
    "architecture_of",
    "download_item",
    "model_item",
    "models_list",
    "settled_downloads",
]

EXTRA_KEY = "troupe"  # upstream clients ignore unknown keys; everything of ours lives here


def architecture_of(entry: ModelEntry, view: ModelView | None) -> dict[str, list[str]]:
    """The catalog's modalities, each replaced by what the child reported once loaded."""
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
        "slots": view.slots,  # requests its child serves at once (its --parallel)
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
        "phase": view.shown_phase,  # its phase, or what the data beside it names ("failed")
        "cpu": _cpu(view),
        "gpu": _gpu(view),
        # The engine's staged progress as one percentage, while it loads (troupe ps).
        "load_percent": load_percent(view.progress) if view.status is Status.LOADING else None,
    }


def _gpu(view: ModelView) -> dict[str, Any] | None:
    """The GPUs its child runs on (docs/gpus.md): troupe's plan, or what its own flags
    name; None where troupe does not place children on GPUs (no GPU, placement off)."""
    plan = view.gpu
    if plan is not None:
        out: dict[str, Any] = {
            "placed_by": "flags" if plan.fixed else "troupe",
            "devices": list(plan.devices),
        }
        if plan.split:
            out["tensor_split"] = list(plan.split)
        if plan.layers is not None:
            out["gpu_layers"] = plan.layers
        return out
    request = view.gpu_request
    if request is not None:
        devices = list(request.devices) if request.devices is not None else None
        return {"placed_by": "flags", "devices": devices}
    return None


def _cpu(view: ModelView) -> dict[str, Any] | None:
    """Where its child runs: the lane troupe gave it, or what its own flags say."""
    if view.cpu is not None:
        plan = view.cpu
        return {
            "placed_by": "troupe",
            "cpus": format_cpus(plan.cpus),
            "threads": plan.threads,
            "shared": plan.shared,
        }
    request = view.cpu_request
    if request is not None:
        cpus = format_cpus(request.cpus) if request.cpus is not None else None
        return {"placed_by": "flags", "cpus": cpus, "threads": request.threads}
    return None


def _memory(ctx: Troupe, view: ModelView | None) -> dict[str, Any] | None:
    need = view.memory_need if view is not None else None
    if not need:
        return None
    report = feasibility(
        sum(need.values()),
        ram_total=ctx.devices.host.total,
        gpu_totals=[g.total for g in ctx.devices.gpus],
    )
    assert view is not None
    return {
        "need_bytes": dict(need),
        "source": view.memory_source,  # "engine" (its own projection) or "estimate"
        "need_at_full_context_bytes": dict(view.memory_high) if view.memory_high else None,
        # What its child holds: none once it has exited.
        "used_bytes": dict(view.memory_used)
        if view.memory_used and view.status.is_running
        else None,
        "feasibility": str(report.colour),
        "why": report.explain(),
    }


def model_item(ctx: Troupe, entry: ModelEntry, created: int, now: float) -> dict[str, Any]:
    view = ctx.scheduler.snapshot.models.get(entry.name)
    status: dict[str, Any] = {
        "value": str(view.api_status) if view else "unloaded",
        "args": ctx.status_args(entry),
        "preset": ctx.catalog.status_preset(entry),
    }
    if view is not None and view.failed:
        status["exit_code"] = view.exit_code
        status["failed"] = True
    rejected = ctx.rejection(entry)
    if rejected:  # it cannot start: a load is refused with this message (no exit code)
        status["failed"] = True
    item: dict[str, Any] = {
        "id": entry.name,
        "aliases": list(entry.sorted_aliases),
        "tags": list(entry.sorted_tags),
        "object": "model",
        "owned_by": "llamacpp",
        "created": created,
        "status": status,
        "architecture": architecture_of(entry, view),
        "source": str(entry.source),
        "can_remove": entry.can_remove,
    }
    if view is not None and view.status.is_running and isinstance(view.loaded_info, dict):
        for key, value in view.loaded_info.items():
            item.setdefault(key, value)
    extras = _extras(view, now)
    if view is not None:
        up = ctx.metrics.up_since.get(entry.name) if view.status.is_running else None
        extras["up_seconds"] = round(now - up, 1) if up is not None else None
        extras["idle_seconds"] = round(now - view.last_used, 1) if view.last_used else None
    facts = ctx.facts.facts(entry.model_path)
    extras["gguf"] = facts_json(facts)
    if extras["gguf"] is not None and "error" not in extras["gguf"]:
        extras["gguf"]["file_bytes"] = file_bytes(entry.model_path, facts)
    extras["memory"] = _memory(ctx, view)
    # The context its child starts with, as troupe doctor and troupe models show it.
    context = child_context(entry, ctx.facts)
    extras["context"] = context.to_json() if context is not None else None
    extras["rejected"] = rejected
    if ctx.kv is not None and ctx.kv.store is not None:  # (no files: no store to show)
        entries, size = ctx.kv.usage(entry.name)
        extras["kv"] = {"entries": entries, "bytes": size, "restore": "on"}
        off = ctx.kv.restore_off(entry.name)
        if off is not None:  # the engine ignored a restore: the store stopped restoring
            extras["kv"].update(restore="off", restore_off=off)
    item[EXTRA_KEY] = extras
    return item


def download_item(view: DownloadView, created: int) -> dict[str, Any]:
    """A ``downloading``/``downloaded`` entry (as upstream's): source cache, no aliases or tags,
    no preset; troupe has no download child, so no child arguments either."""
    progress = {url: {"done": d, "total": t} for url, (d, t) in view.progress.items()}
    extras: dict[str, Any] = {"download": {"progress": progress}}
    if view.error is not None:
        extras["download"].update(error=view.error, status=view.error_status or None)
    if view.listed is not None:
        extras["download"]["listed_as"] = view.listed
    return {
        "id": view.name,
        "aliases": [],
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": created,
        "status": {"value": str(view.status), "args": []},
        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        "source": "cache",
        "can_remove": True,
        EXTRA_KEY: extras,
    }


async def settled_downloads(ctx: Troupe, within: float = 10.0) -> None:
    """Wait (a little) for the reload that follows an ended download, so a ``GET /models``
    after ``download_finished`` lists the model under its new name, as upstream's
    implicit reload does. Only a wait: the reload itself is not this request's."""

    def settled(snap: Snapshot) -> bool:
        return not any(v.status is Status.DOWNLOADED for v in snap.downloads.values())

    with trio.move_on_after(within):
        await ctx.scheduler.wait_until(settled)


def models_list(ctx: Troupe, created: int, tenant: str = "") -> dict[str, Any]:
    """The models ``tenant`` may use (its tenants file's ``models``; "": every one)."""
    now = trio.current_time()
    allows = ctx.tenants.current.allows
    items = [
        (e.name, model_item(ctx, e, created, now))
        for e in ctx.catalog.visible()
        if allows(tenant, (e.name, *e.aliases))
    ]
    for name, view in ctx.scheduler.snapshot.downloads.items():
        if ctx.catalog.get(name) is None and allows(tenant, (name,)):
            items.append((name, download_item(view, created)))
    items.sort(key=lambda item: item[0].encode())
    return {"data": [item for _, item in items], "object": "list"}
