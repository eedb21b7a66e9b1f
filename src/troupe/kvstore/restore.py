"""Bringing a stored entry back into a child's slot: the request's prompt as the engine
tokenizes it, the entry sharing the longest prefix with it (checksummed first), and the
engine's restore. Called under a `Claim` on the slot (no other request uses it meanwhile).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import trio

from troupe.kvstore.engine_api import EngineApi, EngineCallFailed
from troupe.kvstore.metrics import KvMetrics
from troupe.kvstore.store import KvStore, checksum, write_sidecar
from troupe.modellog import about
from troupe.proxy.upstream import Child

__all__ = ["CHAT_PATHS", "COMPLETION_PATHS", "MIN_MATCH", "prompt_tokens", "restore_best", "route"]

log = logging.getLogger("troupe.kvstore")

MIN_MATCH = 64  # a shorter shared prefix is not worth a restore

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
COMPLETION_PATHS = ("/completion", "/completions", "/v1/completions")


def route(path: str) -> str | None:
    """ "chat" or "completion" for the requests the store steers; None for the rest."""
    path = path.split("?", 1)[0]
    for p in CHAT_PATHS:
        if path.endswith(p):
            return "chat"
    for p in COMPLETION_PATHS:
        if path.endswith(p):
            return "completion"
    return None


async def prompt_tokens(
    api: EngineApi, child: Child, kind: str, request: dict[str, Any]
) -> list[int] | None:
    """The request's prompt as ``child``'s engine tokenizes it (chat: through its template)."""
    if kind == "chat":
        if not isinstance(request.get("messages"), list):
            return None
        rendered = await api.call(child, "POST", "/apply-template", request)
        prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
    else:
        prompt = request.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        return None
    payload = {"content": prompt, "add_special": True}
    answer = await api.call(child, "POST", "/tokenize", payload)
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens


def _checksum_or_none(path: Path) -> str | None:
    try:
        return checksum(path)
    except OSError:
        return None


async def restore_best(
    api: EngineApi,
    store: KvStore,
    metrics: KvMetrics,
    child: Child,
    ident: str,
    slot: int,
    tokens: list[int],
    tenant: str = "",
) -> int:
    """Restore into ``child``'s ``slot`` the entry of ``ident`` and ``tenant`` sharing the longest
    prefix with ``tokens`` (at least `MIN_MATCH`); a corrupt entry met on the way is
    dropped. Returns how many tokens it shares with ``tokens`` (0: nothing restored);
    any trouble is logged and counted, never raised."""
    model = child.model
    mlog = about(log, model)
    started = trio.current_time()
    try:
        while True:
            match = store.best_match(ident, tokens, tenant=tenant)
            if match is None or match[1] < MIN_MATCH:
                metrics.lookups.labels(model, "miss").inc()
                return 0
            entry, shared = match
            path = store.file(entry)
            digest = await trio.to_thread.run_sync(_checksum_or_none, path)
            if digest == entry.sha256:
                break
            mlog.warning("KV entry %s is corrupt (checksum): dropped", entry.name)
            metrics.restores.labels(model, "corrupt").inc()
            store.drop(entry)
            entries, size = store.usage(model)
            metrics.stored_entries.labels(model).set(entries)
            metrics.stored_bytes.labels(model).set(size)
        target = f"/slots/{slot}?action=restore"
        answer = await api.call(child, "POST", target, {"filename": path.name})
    except (OSError, EngineCallFailed) as exc:
        mlog.warning("KV restore failed: %s", exc)
        metrics.restores.labels(model, "failed").inc()
        return 0
    seconds = trio.current_time() - started
    store.touch(entry)
    with contextlib.suppress(OSError):  # its last use survives a restart (LRU order)
        await trio.to_thread.run_sync(write_sidecar, entry, store.root)
    n_read = answer.get("n_read", entry.size) if isinstance(answer, dict) else entry.size
    metrics.lookups.labels(model, "hit").inc()
    metrics.restores.labels(model, "restored").inc()
    metrics.bytes.labels(model, "restored").inc(n_read)
    metrics.restore_seconds.labels(model).observe(seconds)
    mlog.info(
        "KV: restored %d tokens (%d shared with the request, %.1f MiB) into slot %d in %.0f ms",
        len(entry.tokens),
        shared,
        entry.size / (1 << 20),
        slot,
        seconds * 1000,
    )
    return shared
