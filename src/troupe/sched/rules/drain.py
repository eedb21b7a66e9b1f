"""Fair admission's drains (``--drain-after``): when one starts, for whom, which busy
model it takes, when it is called off, and the stop once the drained model is idle.

The timer is `DrainClock` (`troupe.sched.drain`): the queue starves when only busy or
pinned models hold the slots (`Evictions` tells it); once it has starved for
``drain_after``, `start_drain` drains the busy model with the least demand (the least
recently used among equals): it takes no new lease, and `StopDrained` stops it once
its requests end. `call_off_drains` ends a drain whose model no longer waits. A child
narrowed for a CPU lane drains the same way (`troupe.sched.placement`).
"""

from __future__ import annotations

from troupe.sched.events import DrainStarted
from troupe.sched.lru import pick_victim
from troupe.sched.phase import Phase
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.rules.parts import Parts, Rule

__all__ = ["StopDrained", "call_off_drains", "drained_for", "start_drain"]


class StopDrained(Rule):
    """A drained model whose last request ended goes (before `Evictions`: its own
    waiters then need a slot of their own, counted in the same settle)."""

    def due(self) -> bool:
        return self.p.table.in_phase(Phase.DRAINING)

    def run(self, now: float) -> None:
        p = self.p
        for m in list(p.table):
            if m.phase is Phase.DRAINING and m.in_flight == 0:
                p.children.stop(m, StopCause(m.drain_reason, m.drain_for), now)


def drained_for(p: Parts, model: str) -> str | None:
    """A model draining (or stopping after its drain) for ``model``, if any."""
    return next((o.name for o in p.table if o.draining_for == model), None)


def call_off_drains(p: Parts) -> None:
    """A drain whose model no longer waits for a slot (it left, or it got one) ends:
    the model takes leases again, before anyone waiting for it is looked at."""
    for m in p.table:
        if m.phase is not Phase.DRAINING:
            continue
        target = m.drain_for
        assert target is not None
        if m.drain_reason is StopReason.REPLAN:
            # Narrowed while its lane overlaps one given away beside it; called off
            # when that child is gone (it failed, or was stopped meanwhile).
            overlapped = p.placement.must_narrow(m)
            if overlapped is not None:
                m.drain_for = overlapped  # the child it is narrowed for now
                continue
        else:
            wanted = p.table.get(target)
            waits = p.queue.find(target) is not None
            if waits and wanted is not None and not wanted.is_running:
                continue
        m.drain_for = None
        m.drain_reason = StopReason.DRAIN
        assert m.reported is not None  # it served: its child said so
        m.move(m.reported)


def start_drain(p: Parts, now: float) -> None:
    """The queue has starved for ``drain_after``: the busy model with the least demand
    (the least recently used among equals) takes no new lease, and is stopped once
    its requests end (fair admission)."""
    table = p.table
    needy = [
        e.model for e in p.queue.entries if not e.loading and not table.models[e.model].is_running
    ]
    if not needy:
        p.clock.drained(found=True)
        return
    demand_now = p.clock.demand_now(now)
    victim = pick_victim(table.models, p.queue, busy=True, now=demand_now)
    if victim is None:
        # Nothing busy to drain: the wait was for a model far less in demand that is
        # still loading (see sched.lru); it has been long enough, an idle one goes.
        idle = pick_victim(table.models, p.queue, now=demand_now, hold=False)
        p.clock.drained(found=idle is not None)
        if idle is not None:
            cause = StopCause(StopReason.LRU, needy[0])
            p.children.stop(table.models[idle], cause, now)
        return
    p.clock.drained(found=True)
    m = table.models[victim]
    m.drain_for = needy[0]
    m.drain_reason = StopReason.DRAIN
    m.move(Phase.DRAINING)
    p.out.emit(DrainStarted(victim, needy[0], m.in_flight))
