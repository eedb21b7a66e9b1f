"""``POST /models/load`` parked loads take upstream's path: spawn if a slot is free,
else stop the least recently used model and wait for it to be gone (or answer "model
limit reached"); with memory admission, free memory first. After the queue: the
waiters asked first."""

from __future__ import annotations

from troupe.sched.effects import Failure
from troupe.sched.lru import pick_victim
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.requests import DirectLoad
from troupe.sched.rules.parts import Rule

__all__ = ["AfterCallOff", "DirectLoads"]


class DirectLoads(Rule):
    def due(self) -> bool:
        return bool(self.p.requests.direct)

    def run(self, now: float) -> None:
        for rid, d in list(self.p.requests.direct.items()):
            self._advance(rid, d, now)

    def _advance(self, rid: int, d: DirectLoad, now: float) -> None:
        p = self.p
        if now < d.not_before:
            return
        d.not_before = 0.0  # slept out: `next_deadline` no longer wakes the core for it
        if p.changes.reloading:
            return
        table = p.table
        m = table.known(d.model)
        if d.victim is None:
            # Parked by a reload: now take upstream's path from the start.
            if m is not None and not m.is_running and not p.has_capacity():
                if any(o.restarting and not o.in_flight for o in table):
                    # A model started again on a narrower lane is chosen from once it is
                    # back: it keeps its place in the LRU order (it may be the victim).
                    return
                victim = pick_victim(table.models, p.queue)
                if victim is not None:
                    chosen = table.models[victim]
                    p.children.stop(chosen, StopCause(StopReason.LRU, d.model), now)
                    d.victim = victim
                    d.victim_gen = chosen.gen
                    return
        else:
            v = table.get(d.victim)
            if v is not None and v.gen == d.victim_gen and v.is_running:
                return  # its child is still going (a restarted victim is not waited for)
        del p.requests.direct[rid]
        if m is None:
            p.out.reply(rid, Failure.not_found("model is not found"))
        elif m.is_running:
            p.out.reply(rid, None)
        elif not p.has_capacity():
            p.out.reply(rid, Failure.server_error("model limit reached, try again later"))
        elif not p.gate.memory_admits(m, now):
            p.requests.direct[rid] = DirectLoad(d.model, d.victim, d.victim_gen)  # freeing
        elif not p.placement.admits(m, now):
            p.requests.direct[rid] = DirectLoad(d.model, None)  # a lane is being freed
        else:
            p.children.spawn(m, now, delay=0.0, cpu=p.placement.take(m.name))
            # Answered at once, before the child has started: a spawn that fails shows as
            # loading -> unloaded (exit code 1) where upstream would answer 500.
            p.out.reply(rid, None)


class AfterCallOff(DirectLoads):
    """Again, when `Replans` called off a narrowed model's restart: a load that waited
    for it picks its victim in this same settle."""

    def due(self) -> bool:
        return self.p.called_off and bool(self.p.requests.direct)
