"""A load that died of out-of-memory is tried once more, once the idle models evicted
for it are gone (`ChildReports.exited` chose them) and it has a CPU lane."""

from __future__ import annotations

from troupe.sched.phase import Restart
from troupe.sched.rules.parts import Rule

__all__ = ["OomRetry"]


class OomRetry(Rule):
    def due(self) -> bool:
        p = self.p
        if p.requests.closed or p.changes.reloading:
            return False
        return p.table.pending(Restart.OOM) and not p.table.any_stopping()

    def run(self, now: float) -> None:
        p = self.p
        for m in list(p.table):
            if m.restart is Restart.OOM and p.placement.admits(m, now):
                p.children.spawn(m, now, delay=0.0, cpu=p.placement.take(m.name))
