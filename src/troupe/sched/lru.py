"""Choosing what to evict: llama.cpp's ``pick_victim`` and ``tick``, as pure functions,
and troupe's demand-aware choice (with fair admission on).

Upstream evicts the least recently used idle model. Among models that all serve a
steady stream, "least recently used" is whichever happened to finish a request last,
and "idle" is a moment between two requests: a popular model idle for a millisecond
was evicted for a rare one, and then the other popular one for it (a cascade of four
loads where two do). With fair admission troupe evicts the model with the least
*demand* (requests, each weighing less as it ages), and does not evict a model while
one with far less demand (under half), busy or still loading, can go once done: it waits
for that one (a rare model serving the requests it was loaded for), the drain timer
bounding the wait.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from troupe.sched.queue import AdmissionQueue
from troupe.sched.table import ModelState

__all__ = ["demand", "evictions_needed", "pick_victim", "record_demand", "ttl_expiry"]

DEMAND_TAU = 60.0  # seconds: a request's weight in a model's demand decays by e each TAU
# Wait for a busy model this many times less in demand than the idle one. A trade of
# loads against the waiting model's latency (bench/swaps.py, two popular models at
# 0.55/0.40 and a rare one): at 1.25 the more popular one idle for a moment is kept for
# the less popular, 3-7 loads against 7-13 at 2, but the rare model waits for the less
# popular one to go idle, p99 250-750 ms against 200-340 (the C++ router: 7-10, 160-350).
# Starving the rare model is what fair admission is for: 2.
HOLD_FOR = 2.0


def demand(m: ModelState, now: float) -> float:
    if not m.demand:
        return 0.0
    return m.demand * math.exp(-max(0.0, now - m.demand_at) / DEMAND_TAU)


def record_demand(m: ModelState, now: float, amount: float = 1.0) -> None:
    """A request asked for ``m`` at ``now``; ``amount``: what it adds (1, less for a
    tenant whose own requests already weigh `sched.fair.TENANT_DEMAND_CAP`)."""
    m.demand = demand(m, now) + amount
    m.demand_at = now


def _evictable(m: ModelState, busy: bool) -> bool:
    if bool(m.in_flight) != busy or not m.phase.serves:
        return False
    return not (m.stopping or m.draining_for is not None or m.pin)


def pick_victim(
    models: Mapping[str, ModelState],
    queue: AdmissionQueue,
    exclude: Iterable[str] = (),
    *,
    busy: bool = False,
    now: float | None = None,
    hold: bool = True,
) -> str | None:
    """The least recently used model that can go, or None.

    Never a busy model (a request in flight), one still coming up (no request to finish
    yet), one already stopping or draining, one a queued request wants, or a pinned
    one. Ties go to the first name in byte order, like upstream's ordered map.
    ``busy``: the other way round, only models with requests in flight (to drain one).
    ``now`` (fair admission): the least demand first, the least recently used among
    equals, and (``hold``) None while a model with far less demand could go instead.
    """
    skip = set(exclude)
    best: str | None = None
    best_key = (0.0, 0.0)
    for name in sorted(models):
        m = models[name]
        if not _evictable(m, busy) or name in skip or queue.find(name) is not None:
            continue
        key = (0.0 if now is None else demand(m, now), m.last_used)
        if best is None or key < best_key:
            best, best_key = name, key
    if best is None or now is None or busy or not hold:
        return best
    for name, m in models.items():
        if name == best or name in skip or not m.is_running:
            continue
        if m.stopping or m.draining_for is not None or m.pin:
            continue
        # Busy, loading or wanted by a queued request: it can go once done with those.
        if demand(m, now) * HOLD_FOR < best_key[0]:
            return None  # wait for it rather than evict a model in demand
    return best


def evictions_needed(
    models: Mapping[str, ModelState], queue: AdmissionQueue, models_max: int
) -> int:
    """How many more slots the queue needs freed (upstream ``tick``'s ``n_needed - n_free``).

    Stopping (and draining) models count as free (they are on their way out); a claimed
    entry already owns a slot, and an entry whose model is up needs none.
    """
    if models_max <= 0 or not queue.entries:
        return 0
    n_running = sum(1 for m in models.values() if m.is_running)
    # A model draining for a queued one is on its way out, like a stopping one.
    n_stopping = sum(
        1 for m in models.values() if m.is_running and (m.stopping or m.draining_for is not None)
    )
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


def ttl_expiry(m: ModelState, queue: AdmissionQueue) -> float | None:
    """When ``m``'s ttl unloads it, if it has one and is idle (up, no request in flight
    or queued, not pinned: pinned means never unloaded on troupe's own initiative)."""
    ttl = m.ttl
    if ttl is None or not m.phase.serves or m.pin or m.in_flight:
        return None
    if queue.find(m.name) is not None:
        return None
    return m.idle_since + ttl
