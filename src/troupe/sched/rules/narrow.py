"""Each serving child whose lane overlaps one given away beside it in this settle is
narrowed: stopped at once when idle, drained when busy (`Placement.narrow`)."""

from __future__ import annotations

from troupe.sched.rules.parts import Rule

__all__ = ["Narrow"]


class Narrow(Rule):
    def due(self) -> bool:
        return self.p.placement.ledger is not None

    def run(self, now: float) -> None:
        self.p.placement.narrow(now)
