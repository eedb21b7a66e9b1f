"""CPU lanes reserved for models that no longer wait are given up."""

from __future__ import annotations

from troupe.sched.rules.parts import Rule

__all__ = ["ReserveLanes"]


class ReserveLanes(Rule):
    def due(self) -> bool:
        return self.p.placement.holds_any()

    def run(self, now: float) -> None:
        p = self.p
        p.placement.keep_reserved({e.model for e in p.queue.entries} | set(p.requests.wanted()))
