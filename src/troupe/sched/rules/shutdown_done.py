"""A shutdown (`SchedulerCore.stop_all`) is answered once no child runs."""

from __future__ import annotations

from troupe.sched.rules.parts import Rule

__all__ = ["ShutdownDone"]


class ShutdownDone(Rule):
    def due(self) -> bool:
        return bool(self.p.requests.stop_all) and not self.p.table.running_count()

    def run(self, now: float) -> None:
        stop_all = self.p.requests.stop_all
        for rid in stop_all:
            self.p.out.reply(rid, None)
        stop_all.clear()
