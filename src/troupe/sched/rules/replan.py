"""A child stopped to be narrowed (CPU placement) starts again on its new lane, after
the waiters (the model it made room for plans first); with no slot left for it, it is
just unloaded (a request brings it back), and `AfterCallOff` lets a parked load that
waited for it pick its victim."""

from __future__ import annotations

from troupe.sched.phase import Phase, Restart
from troupe.sched.rules.parts import Rule

__all__ = ["Replans"]


class Replans(Rule):
    def due(self) -> bool:
        return self.p.table.pending(Restart.REPLAN)

    def run(self, now: float) -> None:
        p = self.p
        for m in list(p.table):
            if m.restart is not Restart.REPLAN:
                continue
            if p.requests.closed or not p.has_capacity():
                m.move(Phase.UNLOADED)  # its second start is called off
                p.called_off = True
            elif not p.changes.reloading and p.placement.admits(m, now):
                p.children.spawn(m, now, delay=0.0, cpu=p.placement.take(m.name))
