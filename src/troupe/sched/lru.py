"""Choosing what to evict: llama.cpp's ``pick_victim`` and ``tick``, as pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from troupe.sched.queue import AdmissionQueue
from troupe.sched.table import ModelState

__all__ = ["evictions_needed", "pick_victim"]


def pick_victim(
    models: Mapping[str, ModelState],
    queue: AdmissionQueue,
    exclude: Iterable[str] = (),
    *,
    busy: bool = False,
) -> str | None:
    """The least recently used model that can go, or None.

    Never a busy model (a request in flight), one still coming up (no request to finish
    yet), one already stopping or draining, one a queued request wants, or a pinned
    one. Ties go to the first name in byte order, like upstream's ordered map.
    ``busy``: the other way round, only models with requests in flight (to drain one).
    """
    skip = set(exclude)
    best: str | None = None
    best_used = 0.0
    for name in sorted(models):
        m = models[name]
        if bool(m.in_flight) != busy or not m.status.is_ready_or_sleeping or m.spawn_pending:
            continue
        if m.stopping or m.draining_for is not None or m.config.pin:
            continue
        if name in skip or queue.find(name) is not None:
            continue
        if best is None or m.last_used < best_used:
            best, best_used = name, m.last_used
    return best


def evictions_needed(
    models: Mapping[str, ModelState], queue: AdmissionQueue, models_max: int
) -> int:
    """How many more slots the queue needs freed (upstream ``tick``'s ``n_needed - n_free``).

    Stopping models count as free (they are on their way out); a claimed entry already
    owns a slot, and an entry whose model is up needs none.
    """
    if models_max <= 0 or not queue.entries:
        return 0
    n_running = sum(1 for m in models.values() if m.is_running)
    n_stopping = sum(1 for m in models.values() if m.is_running and m.stopping)
    n_needed = 0
    n_claimed = 0
    for e in queue.entries:
        m = models.get(e.model)
        if m is not None and m.is_running and not m.stopping:
            # Already owns its slot (a direct load started it, or its spawn is pending):
            # upstream counts it as needing one more and evicts for nothing.
            continue
        if e.loading:
            n_claimed += 1
        else:
            n_needed += 1
    n_free = models_max - n_running + n_stopping - n_claimed
    return max(0, n_needed - n_free)
