"""The queue: each waiting request is served, refused, loaded for or made to wait
(one step of upstream's ``ensure_model_ready`` loop), until nothing changes.

`judge` is the rule for one waiter and returns a typed verdict; `Waiters` carries it
out and records a `Wait`'s reason on the waiter's queue entry, which ``/models`` and the
``troupe_queue`` events show as they are.
"""

from __future__ import annotations

from troupe.sched.effects import Failure
from troupe.sched.limits import FAKE_TIMING_DELAY
from troupe.sched.phase import Phase, Restart
from troupe.sched.requests import Waiter
from troupe.sched.rules.drain import call_off_drains
from troupe.sched.rules.parts import Parts, Rule
from troupe.sched.verdicts import (
    LOADING,
    RELOADING,
    WAITING_FOR_SLOT,
    Load,
    Refuse,
    Serve,
    Wait,
    WaiterVerdict,
)

__all__ = ["Waiters", "judge"]


class Waiters(Rule):
    def due(self) -> bool:
        p = self.p
        # A drain whose model left the queue is called off even when nobody waits.
        return bool(p.requests.waiters) or p.table.in_phase(Phase.DRAINING)

    def run(self, now: float) -> None:
        p = self.p
        # Until nothing changes: a waiter looked at before the entry ahead of it emptied
        # must be looked at again now, not at some later, unrelated event.
        while True:
            # Before each pass: a drain whose model left the queue in the pass before
            # ends now, and the drained model's waiters are served in this very settle.
            call_off_drains(p)
            before = p.queue_state()
            for rid, w in list(p.requests.waiters.items()):
                self._carry_out(rid, w, judge(p, w, now), now)
            if before == p.queue_state():
                break

    def _carry_out(self, rid: int, w: Waiter, verdict: WaiterVerdict, now: float) -> None:
        p = self.p
        name = w.model
        if isinstance(verdict, Wait):
            if w.queued and (entry := p.queue.find(name)) is not None:
                entry.reason = LOADING if entry.loading else verdict.reason
                entry.gated = None if entry.loading else verdict.gated
            return
        if isinstance(verdict, Serve) and w.slot:
            # It takes one of the child's slots: `SlotGrants` (sched.fair) grants it when
            # one is free and it is its turn. Meanwhile it keeps a share of its model's
            # entry, marked as holding its model (no other load waits behind it), so the
            # model is neither evicted nor expired while requests wait for it.
            if not w.queued:
                p.queue.join(name)
                w.queued = True
            entry = p.queue.find(name)
            assert entry is not None
            entry.loading, entry.reason = True, WAITING_FOR_SLOT
            w.did_load = w.saw_loading = False
            w.slot_wait = True
            return
        if isinstance(verdict, Load):
            p.queue.claim(name)
            entry = p.queue.find(name)
            assert entry is not None
            entry.reason, entry.gated = LOADING, None
            w.did_load = True
            # Upstream's load() sleeps here under LLAMA_SERVER_DEBUG_FAKE_TIMING (a direct
            # POST /models/load waits it out before it picks a victim: `DirectLoad.not_before`).
            delay = FAKE_TIMING_DELAY if p.limits.fake_timing else 0.0
            p.children.spawn(p.table.models[name], now, delay=delay, cpu=p.placement.take(name))
            return
        del p.requests.waiters[rid]
        if w.queued:
            p.queue.leave(name)
        if isinstance(verdict, Serve):
            m = p.table.models[name]
            p.grant(rid, m, w.update_last_used, now, waited=now > w.since)
        else:
            p.out.reply(rid, verdict.failure)


def judge(p: Parts, w: Waiter, now: float) -> WaiterVerdict:
    """One step of upstream's wait loop for one waiter (``ensure_model_ready``'s loop).
    Joins the queue behind a stopping child, notes a load seen, lifts a hold whose
    time is up, and asks the gate (which may ask for a reading or an eviction)."""
    name = w.model
    m = p.table.known(name)
    if m is None:
        return Refuse(Failure.server_error(f"model name={name} is not found"))
    phase = m.phase
    if w.slot_wait and not phase.serves:
        # It waited for a slot of a child that is going or gone: it asks the next one.
        w.slot_wait = False
        if not w.autoload:
            return Refuse(Failure.bad_request("model is not loaded"))
        if not w.queued and (not m.is_running or m.delayed):
            p.queue.join(name)
            w.queued = True
    if m.stopping or phase is Phase.DRAINING:
        # A stopping (or draining) instance takes no new request; the next one serves
        # it, after the models ahead in line.
        if not w.queued:
            p.queue.join(name)
            w.queued = True
        if m.stopping:
            return Wait("waiting for its previous instance to stop")
        return Wait(f"being swapped out for {m.drain_for}: waits for the next instance")
    if phase.serves:
        return Serve()
    if m.delayed:
        return Wait(LOADING)  # claimed: waiting out fake timing
    if phase is Phase.LOADING or phase is Phase.STARTING:
        w.saw_loading = True
        return Wait(LOADING)
    restart = m.restart
    if restart is not None and p.changes.reloading:
        return Wait(RELOADING)  # started again once the reload is done
    if restart is Restart.OOM:
        return Wait("waiting to load again once the models evicted for it are gone")
    if restart is Restart.REPLAN:
        return Wait("waiting for its instance to start again on a narrower CPU lane")
    if w.did_load or w.saw_loading:
        if m.failed:
            detail = f": {m.last_error}" if m.last_error else ""
            return Refuse(Failure.server_error(f"model name={name} failed to load{detail}"))
        return Refuse(Failure.bad_request(f"model name={name} is not running"))
    if not w.queued:
        return Refuse(Failure.bad_request(f"model name={name} is not running"))
    if p.crashes.held_back(m, now):
        return Refuse(Failure.unavailable(p.crashes.message(m, now)))
    if p.changes.reloading:
        return Wait(RELOADING)
    if not p.queue.can_claim(name):
        first = p.queue.next_to_claim()
        return Wait(f"in line behind {first.model}" if first is not None else LOADING)
    return p.gate.verdict(m, now)
