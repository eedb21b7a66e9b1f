"""Evict idle models while queued requests outnumber free slots (upstream's ``tick``),
read ahead the files of the models waiting for a slot, and tell fair admission's clock
whether the queue starves (only busy or pinned models hold the slots).

Which model goes is `troupe.sched.lru.pick_victim`; how many, `evictions_needed`.
"""

from __future__ import annotations

from troupe.sched.effects import Prefetch
from troupe.sched.lru import evictions_needed, pick_victim
from troupe.sched.phase import Phase
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.rules.parts import Parts, Rule

__all__ = ["Evictions"]


class Evictions(Rule):
    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        self._prefetched: set[str] = set()  # models waiting for a slot, files read ahead

    def due(self) -> bool:
        # With an empty queue only what the last run left behind is undone.
        p = self.p
        return bool(p.queue.entries) or bool(self._prefetched) or p.clock.starving

    def run(self, now: float) -> None:
        p = self.p
        table, queue = p.table, p.queue
        need = evictions_needed(table.models, queue, p.limits.models_max)
        # The free slots go to the first entries in line; the evictions are for the rest.
        needy = [
            e
            for e in queue.entries
            if not e.loading
            and not (table.models[e.model].is_running and not table.models[e.model].stopping)
        ]
        self._prefetch([e.model for e in needy])
        starving = False
        for e in needy[len(needy) - need :] if need > 0 else []:
            victim = pick_victim(table.models, queue, now=p.clock.demand_now(now))
            if victim is None:
                starving = True  # everything left is busy or pinned
                break
            p.children.stop(table.models[victim], StopCause(StopReason.LRU, e.model), now)
        draining = table.in_phase(Phase.DRAINING)
        quiet = not p.requests.closed and not p.changes.reloading and not draining
        p.clock.observe(now, starving=starving, quiet=quiet)

    def _prefetch(self, needy: list[str]) -> None:
        """Each model that waits for a slot has its files read ahead, once per wait."""
        self._prefetched &= set(needy)
        for model in needy:
            if model not in self._prefetched and not self.p.requests.closed:
                self._prefetched.add(model)
                self.p.out.add(Prefetch(model))
