"""Ollama's model routes over troupe's catalog: list, show, running, pull, delete;
the version and the root probe; the routes troupe cannot honour."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import trio

from troupe.actors.scheduler import ModelUnavailable
from troupe.api import dumps
from troupe.assembly import Troupe
from troupe.catalog.hfcache import split_repo_tag
from troupe.errors import ConfigError
from troupe.http.models_json import settled_downloads
from troupe.http.server.exchange import Exchange
from troupe.ollama.common import (
    NDJSON,
    NDJSON_TYPE,
    may_admin,
    may_use,
    model_entry,
    read_json,
    refuse_admin,
    send_error,
)
from troupe.ollama.info import chat_template, ps_item, show_json, tags_item
from troupe.ollama.names import hub_name, resolve
from troupe.sched import Status

__all__ = [
    "OLLAMA_VERSION",
    "delete",
    "ps",
    "pull",
    "root",
    "show",
    "tags",
    "unsupported",
    "version",
]

log = logging.getLogger("troupe.ollama")

# The Ollama release whose API these routes follow (clients gate features on it).
OLLAMA_VERSION = "0.12.6"
_RUNNING = b"Ollama is running"


async def root(ctx: Troupe, ex: Exchange) -> None:
    await ex.respond(200, _RUNNING, "text/plain; charset=utf-8")


async def version(ctx: Troupe, ex: Exchange) -> None:
    await ex.respond(200, dumps({"version": OLLAMA_VERSION}))


async def tags(ctx: Troupe, ex: Exchange) -> None:
    models = [tags_item(ctx, e) for e in ctx.catalog.visible() if may_use(ctx, ex, e)]
    await ex.respond(200, dumps({"models": models}))


async def ps(ctx: Troupe, ex: Exchange) -> None:
    snapshot = ctx.scheduler.snapshot
    out = []
    for entry in ctx.catalog:
        view = snapshot.models.get(entry.name)
        # As /models shows it: a child started again on a narrower CPU lane stays listed.
        if view is not None and view.api_status.is_ready_or_sleeping and may_use(ctx, ex, entry):
            out.append(ps_item(ctx, entry, view))
    await ex.respond(200, dumps({"models": out}))


async def show(ctx: Troupe, ex: Exchange) -> None:
    req = await read_json(ex)
    if req is None:
        return
    entry = await model_entry(ctx, ex, req)
    if entry is not None:
        template = await trio.to_thread.run_sync(chat_template, ctx, entry)
        await ex.respond(200, dumps(show_json(ctx, entry, template)))


async def delete(ctx: Troupe, ex: Exchange) -> None:
    """``DELETE /api/delete``: a Hugging Face cache model's files (troupe's
    ``DELETE /models``); models from a models directory or a preset are the operator's."""
    req = await read_json(ex)
    if req is None:
        return
    entry = await model_entry(ctx, ex, req)
    if entry is None:
        return
    if not may_admin(ctx, ex):
        await refuse_admin(ex, "delete models")
        return
    if not entry.can_remove:
        message = (
            f"model {entry.name!r} cannot be deleted: troupe deletes only models it "
            f"downloaded (the Hugging Face cache); this one comes from {entry.source}"
        )
        await send_error(ex, 400, message)
        return
    try:
        await ctx.scheduler.remove(entry.name)
    except ModelUnavailable as exc:
        await send_error(ex, exc.failure.status, exc.failure.message, exc.failure)
        return
    await ex.respond(200, b"")


def _progress_lines(name: str, event: dict[str, Any], seen: dict[str, int]) -> list[Any]:
    """A ``download_progress`` event as Ollama's per-file progress objects (only the
    files that moved)."""
    out = []
    progress = (event.get("data") or {}).get("progress") or {}
    for url, figures in progress.items():
        done, total = int(figures.get("done", 0)), int(figures.get("total", 0))
        if seen.get(url) == done:
            continue
        seen[url] = done
        file = url.rsplit("/", 1)[-1].split("?", 1)[0]
        out.append({"status": f"pulling {file}", "digest": file, "total": total, "completed": done})
    return out


async def pull(ctx: Troupe, ex: Exchange) -> None:
    """``POST /api/pull``: troupe's download (``org/repo[:TAG]`` from the Hugging Face
    hub, resumed, size- and sha256-checked), its progress in Ollama's shape. A pull of a
    name already downloading follows that download; the download goes on if the client
    leaves."""
    req = await read_json(ex)
    if req is None:
        return
    name = req.get("model") or req.get("name")
    if not isinstance(name, str) or not name:
        await send_error(ex, 400, "model is required")
        return
    name = hub_name(name)  # hf.co/org/repo:TAG is org/repo:TAG
    stream = req.get("stream") is not False
    present = resolve(ctx.catalog, name)
    if present is not None and not may_use(ctx, ex, present):
        present = None  # one this key may not use is one that is not there
    if present is not None and name not in ctx.scheduler.snapshot.downloads:
        await _finish(ex, stream, [{"status": "pulling manifest"}, {"status": "success"}])
        return  # nothing to download: no admin action
    if not may_admin(ctx, ex):
        await refuse_admin(ex, "pull models")
        return
    try:
        split_repo_tag(name)
    except ConfigError as exc:
        message = f"troupe pulls from the Hugging Face hub: want org/repo[:TAG] ({exc})"
        await send_error(ex, 400, message)
        return
    with ctx.scheduler.subscribe() as events:
        view = ctx.scheduler.snapshot.downloads.get(name)
        if view is None or view.status is not Status.DOWNLOADING:
            plan, why, status = await ctx.downloads.plan(name)
            try:
                await ctx.scheduler.start_download(name, plan, why, status)
            except ModelUnavailable as exc:
                await send_error(ex, exc.failure.status, exc.failure.message, exc.failure)
                return
        lines = _follow(ctx, name, events)
        if stream:
            await ex.send(ex.head(200, NDJSON, length=None))
            async for line in lines:
                line.pop("_status", None)
                data = dumps(line) + b"\n"
                ex.sent += len(data)
                await ex.send(ex.chunk(data))
            await ex.send(ex.last_chunk)
            return
        last: dict[str, Any] = {}
        async for line in lines:
            last = line
        if "error" in last:
            await send_error(ex, int(last.get("_status", 500)), last["error"])
        else:
            await ex.respond(200, dumps({"status": "success"}))


async def _follow(
    ctx: Troupe, name: str, events: trio.MemoryReceiveChannel[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    yield {"status": "pulling manifest"}
    seen: dict[str, int] = {}
    async for event in events:
        if event.get("model") != name:
            continue
        kind = event.get("event")
        if kind == "download_progress":
            for line in _progress_lines(name, event, seen):
                yield line
        elif kind == "download_failed":
            data = event.get("data") or {}
            status = int(data.get("status") or 500)
            yield {"error": f"pull {name}: {data.get('reason') or 'failed'}", "_status": status}
            return
        elif kind == "download_finished":
            break
    await settled_downloads(ctx)  # listed under its name once the reload is done
    for step in ("verifying sha256 digest", "writing manifest", "success"):
        yield {"status": step}


async def _finish(ex: Exchange, stream: bool, lines: list[dict[str, Any]]) -> None:
    if not stream:
        await ex.respond(200, dumps(lines[-1]))
        return
    await ex.respond(200, b"".join(dumps(line) + b"\n" for line in lines), NDJSON_TYPE)


def unsupported(why: str) -> Any:
    """A route Ollama has and troupe cannot honour: Ollama's error shape, and why."""

    async def handler(ctx: Troupe, ex: Exchange) -> None:
        await send_error(ex, 501, why)

    return handler
