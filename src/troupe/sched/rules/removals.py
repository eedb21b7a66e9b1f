"""A removed model (``DELETE /models``) leaves the table once its child is gone, and
its files are deleted then."""

from __future__ import annotations

from troupe.sched.effects import DeleteFiles
from troupe.sched.rules.parts import Rule

__all__ = ["Removals"]


class Removals(Rule):
    def due(self) -> bool:
        return bool(self.p.changes.removals)

    def run(self, now: float) -> None:
        p = self.p
        for rid, model in list(p.changes.removals.items()):
            gone = p.table.get(model)
            if gone is None or not gone.is_running:
                del p.changes.removals[rid]
                p.table.drop(model)
                p.forget_measurement(model)
                p.out.add(DeleteFiles(rid, model))
