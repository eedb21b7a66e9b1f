"""The free slots of loaded models go to the requests waiting for one, in fair
queuing's order (class priority, least attained service per weight, arrival):
`troupe.sched.fair.Fair.grant_waiting`."""

from __future__ import annotations

from troupe.sched.requests import Waiter
from troupe.sched.rules.parts import Rule
from troupe.sched.table import ModelState

__all__ = ["SlotGrants"]


class SlotGrants(Rule):
    def due(self) -> bool:
        # Nobody waiting: only the bypass counts of tenants no longer waiting to forget.
        return bool(self.p.requests.waiters) or self.p.fair.remembers_bypasses

    def run(self, now: float) -> None:
        p = self.p

        def grant(rid: int, w: Waiter, m: ModelState) -> None:
            del p.requests.waiters[rid]
            if w.queued:
                p.queue.leave(w.model)
            p.grant(rid, m, w.update_last_used, now, waited=now > w.since, terms=w.terms, slot=True)

        p.fair.grant_waiting(p.table, p.requests, now, grant)
