"""Fair admission's clock: how long the queue has starved, and the swaps it caused.

A model that gets no slot because every loaded model is busy waits at most
``drain_after`` seconds; then the busy model with the least demand is drained for
it (which one, and when a drain ends: `troupe.sched.rules.drain`). ``drain_after`` None
is upstream's behaviour: no drain, and victims chosen by recency alone.
"""

from __future__ import annotations

from collections import deque

__all__ = ["SWAP_WINDOW", "DrainClock"]

SWAP_WINDOW = 60.0  # seconds: swaps_per_minute


class DrainClock:
    def __init__(self, drain_after: float | None) -> None:
        self.drain_after = drain_after
        self._starved_since: float | None = None
        self._futile = False  # a drain found no victim: none again until a lease is taken
        self._swaps: deque[float] = deque()

    @property
    def fair(self) -> bool:
        """Fair admission is on (victims by demand, drains, a swap beside its victim)."""
        return self.drain_after is not None

    def demand_now(self, now: float) -> float | None:
        """The time victims' demand is reckoned at; None: by recency, as upstream."""
        return now if self.drain_after is not None else None

    def observe(self, now: float, *, starving: bool, quiet: bool) -> None:
        """After each settle: does the queue starve (only busy or pinned models hold the
        slots), with nothing under way that could end it?"""
        if starving and quiet and not self._futile:
            if self._starved_since is None:
                self._starved_since = now
        else:
            self._starved_since = None

    @property
    def starving(self) -> bool:
        """The last settle saw the queue starve (the drain timer runs)."""
        return self._starved_since is not None

    def deadline(self) -> float | None:
        if self._starved_since is None or self.drain_after is None:
            return None
        return self._starved_since + self.drain_after

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def drained(self, *, found: bool) -> None:
        """A drain was started (``found``: it had a victim); the wait begins anew."""
        self._starved_since = None
        if not found:
            self._futile = True

    def lease_taken(self) -> None:
        """A model newly busy may be one a drain can take."""
        self._futile = False

    def swapped(self, now: float) -> None:
        self._swaps.append(now)

    def recent_swaps(self, now: float) -> tuple[float, ...]:
        while self._swaps and self._swaps[0] <= now - SWAP_WINDOW:
            self._swaps.popleft()
        return tuple(self._swaps)
