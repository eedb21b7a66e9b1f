"""Each serving child whose lane overlaps one given away beside it in this settle is
narrowed: stopped at once when idle, drained when busy (`Placement.narrow`). A model
that waits for its lane then says what it waits for (that child's requests, or its
stop)."""

from __future__ import annotations

from troupe.sched.rules.parts import Rule
from troupe.sched.verdicts import NO_LANE

__all__ = ["Narrow"]


class Narrow(Rule):
    def due(self) -> bool:
        return self.p.placement.ledger is not None

    def run(self, now: float) -> None:
        p = self.p
        p.placement.narrow(now)
        for e in p.queue.entries:
            if e.reason == NO_LANE and (m := p.table.get(e.model)) is not None:
                e.reason = p.gate.wait(m, NO_LANE).reason
