"""Settling: after every event, who is answered, who loads, and what is evicted.

The waiting rules follow llama.cpp's ``ensure_model_ready`` and its admission queue, applied
the moment something changes instead of every 200 ms. `Settler` holds no state of its
own beyond the files it has read ahead: it works on the collaborators the core gives
it, and each rule below is one method.
"""

from __future__ import annotations

import attrs

from troupe.sched.admission import MemoryAdmission
from troupe.sched.children import Children, CrashRecord
from troupe.sched.drain import DrainClock
from troupe.sched.effects import (
    DeleteFiles,
    Failure,
    Grant,
    Prefetch,
    Reloaded,
)
from troupe.sched.events import CatalogueReloaded, DrainStarted
from troupe.sched.gate import LoadGate
from troupe.sched.lru import evictions_needed, pick_victim
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase
from troupe.sched.placement import Placement
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.reloads import CatalogueChanges
from troupe.sched.requests import DirectLoad, Lease, Requests, Waiter
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig, ModelState, ModelTable

__all__ = ["FAKE_TIMING_DELAY", "Limits", "Settler"]

FAKE_TIMING_DELAY = 2.0  # LLAMA_SERVER_DEBUG_FAKE_TIMING: seconds before each load


@attrs.frozen
class Limits:
    models_max: int  # 0: no limit
    queue_max: int = 0  # 0: no limit on waiting requests
    fake_timing: bool = False


class Settler:
    def __init__(
        self,
        limits: Limits,
        table: ModelTable,
        queue: AdmissionQueue,
        requests: Requests,
        changes: CatalogueChanges,
        children: Children,
        crashes: CrashRecord,
        clock: DrainClock,
        memory: MemoryAdmission | None,
        projections: Projections | None,
        outbox: Outbox,
        placement: Placement,
    ) -> None:
        self.limits = limits
        self._table = table
        self._queue = queue
        self._requests = requests
        self._changes = changes
        self._children = children
        self._crashes = crashes
        self._clock = clock
        self._memory = memory
        self._projections = projections
        self._out = outbox
        self._prefetched: set[str] = set()  # models waiting for a slot, files read ahead
        self.gate = LoadGate(
            limits.models_max, table, queue, clock, memory, projections, children, outbox,
            placement,
        )  # fmt: skip
        self.placement = placement

    def has_capacity(self) -> bool:
        return self.gate.has_capacity()

    # ----- shared with the core --------------------------------------------------------------

    def grant(
        self, rid: int, m: ModelState, update_last_used: bool, now: float, *, waited: bool
    ) -> None:
        if update_last_used:
            m.last_used = now
        m.in_flight += 1
        self._clock.lease_taken()
        self._requests.leases[rid] = Lease(m.name, m.gen)
        self._out.reply(rid, Grant(m.name, m.port, m.gen, waited))

    def forget_measurement(self, name: str) -> None:
        if self._projections is not None:
            self._projections.forget(name)

    def apply_estimate(self, config: ModelConfig) -> None:
        """The best figure known for ``config`` before it runs: the engine's projection
        for this command line, else the catalogue's estimate."""
        if self._projections is not None:
            self._projections.estimate(config)
        elif self._memory is not None:
            self._memory.ledger.set_estimate(config.name, config.need)

    # ----- the settle ------------------------------------------------------------------------

    def settle(self, now: float) -> None:
        """Re-examine every waiter and parked load, then free slots the queue needs."""
        table, changes = self._table, self._changes
        self.placement.keep_reserved(
            {e.model for e in self._queue.entries} | set(self._requests.wanted())
        )
        pending = changes.reload
        if pending is not None and not any(
            (m := table.get(n)) is not None and m.is_running for n in pending.restart
        ):
            self._finish_reload(now)
        for rid, model in list(changes.removals.items()):
            gone = table.get(model)
            if gone is None or not gone.is_running:
                del changes.removals[rid]
                table.drop(model)
                self.forget_measurement(model)
                self._out.add(DeleteFiles(rid, model))
        if not self._requests.closed and not changes.reloading and not table.any_stopping():
            for m in list(table):
                if m.phase is Phase.RETRYING and self.placement.admits(m, now):
                    # An out-of-memory load, tried once more.
                    self._children.spawn(m, now, delay=0.0, cpu=self.placement.take(m.name))
        # Until nothing changes: a waiter looked at before the entry ahead of it emptied
        # must be looked at again now, not at some later, unrelated event.
        while True:
            # Before each pass: a drain whose model left the queue in the pass before
            # ends now, and the drained model's waiters are served in this very settle.
            self._call_off_drains()
            before = self._queue_state()
            for rid, w in list(self._requests.waiters.items()):
                self._advance(rid, w, now)
            if before == self._queue_state():
                break
        for rid, d in list(self._requests.direct.items()):
            self._advance_direct(rid, d, now)
        if self._respawn_replanned(now):
            # A restart called off: a load that waited for it picks its victim now.
            for rid, d in list(self._requests.direct.items()):
                self._advance_direct(rid, d, now)
        self.placement.narrow(now)
        self._tick(now)
        self.measure_next()
        for rid, (model, gen) in list(self._requests.until_gone.items()):
            m = table.get(model)
            if m is None or m.gen != gen or not m.is_running:  # that child is gone
                del self._requests.until_gone[rid]
                self._out.reply(rid, None)
        stop_all = self._requests.stop_all
        if stop_all and not table.running_count():
            for rid in stop_all:
                self._out.reply(rid, None)
            stop_all.clear()

    def _queue_state(self) -> tuple[list[tuple[str, bool, int]], int]:
        entries = [(e.model, e.loading, e.waiters) for e in self._queue.entries]
        return entries, len(self._requests.waiters)

    def _respawn_replanned(self, now: float) -> bool:
        """A child stopped to be narrowed starts again on its new lane, after the waiters
        (the model it made room for plans first); with no slot left for it, it is just
        unloaded (a request brings it back). True if one was unloaded."""
        called_off = False
        for m in list(self._table):
            if m.phase is not Phase.REPLANNING:
                continue
            if self._requests.closed or not self.has_capacity():
                m.move(Phase.UNLOADED)
                called_off = True
            elif not self._changes.reloading and self.placement.admits(m, now):
                self._children.spawn(m, now, delay=0.0, cpu=self.placement.take(m.name))
        return called_off

    def _finish_reload(self, now: float) -> None:
        """Swap in the new model list (upstream's reload, after its stops), once every model
        the reload stops is gone."""
        table, changes = self._table, self._changes
        pending = changes.reload
        assert pending is not None
        changes.reload = None
        fresh = {c.name: c for c in pending.models}
        for name, m in list(table.models.items()):
            if name not in fresh:
                self.forget_measurement(name)
                if m.is_running:
                    table.retire(name)  # dropped once its child is gone
                    self._children.stop(m, StopCause(StopReason.DROPPED), now)
                else:
                    table.drop(name)
        for name, config in fresh.items():
            existing = table.get(name)
            if existing is None or existing.config.fingerprint != config.fingerprint:
                self.forget_measurement(name)  # a new command line: measured again
                if self._projections is not None and config.need:
                    self._projections.add([name])
            if existing is None:
                table.add(config)
                continue
            m = existing
            if self._memory is not None and m.config.fingerprint != config.fingerprint:
                self._memory.ledger.effective.pop(name, None)  # seen under another command line
            m.config = config
            if not changes.removing(name):
                table.keep(name)
            if not m.is_running:
                m.exit_code = 0  # a reload clears "failed"
                m.crashes.clear()
                m.held_until = None
                if m.phase is not Phase.RETRYING:
                    m.move(Phase.UNLOADED)
        if self._memory is not None:
            for config in fresh.values():
                self.apply_estimate(config)
        self._out.emit(CatalogueReloaded())
        self._out.add(Reloaded(pending.rid, tuple(pending.rids)))
        for rid in pending.rids:
            self._out.reply(rid, None)

    def _finish(self, rid: int, w: Waiter, result: Failure) -> None:
        del self._requests.waiters[rid]
        if w.queued:
            self._queue.leave(w.model)
        self._out.reply(rid, result)

    def _advance(self, rid: int, w: Waiter, now: float) -> None:
        """One step of upstream's wait loop for one waiter (``ensure_model_ready``'s loop)."""
        name = w.model
        m = self._table.known(name)
        if m is None:
            self._finish(rid, w, Failure.server_error(f"model name={name} is not found"))
            return
        if m.stopping or m.phase is Phase.DRAINING:
            # A stopping (or draining) instance takes no new request; the next one serves
            # it, after the models ahead in line.
            if not w.queued:
                self._queue.join(name)
                w.queued = True
            return
        status = m.status
        if status.is_ready_or_sleeping:
            del self._requests.waiters[rid]
            if w.queued:
                self._queue.leave(name)
            self.grant(rid, m, w.update_last_used, now, waited=now > w.since)
            return
        if status is Status.LOADING:
            w.saw_loading = True
            return
        if m.spawn_pending or m.phase in (Phase.RETRYING, Phase.REPLANNING):
            return  # claimed, or started again (after an out-of-memory death, a re-plan)
        if w.did_load or w.saw_loading:
            if m.failed:
                detail = f": {m.last_error}" if m.last_error else ""
                self._finish(
                    rid, w, Failure.server_error(f"model name={name} failed to load{detail}")
                )
            else:
                self._finish(rid, w, Failure.bad_request(f"model name={name} is not running"))
            return
        if not w.queued:
            self._finish(rid, w, Failure.bad_request(f"model name={name} is not running"))
            return
        if self._crashes.held_back(m, now):
            self._finish(rid, w, Failure.unavailable(self._crashes.message(m, now)))
            return
        if not self._changes.reloading and self._queue.can_claim(name) and self.gate.admits(m, now):
            self._queue.claim(name)
            w.did_load = True
            # Upstream's load() sleeps here under LLAMA_SERVER_DEBUG_FAKE_TIMING (a direct
            # POST /models/load waits it out before it picks a victim: `DirectLoad.not_before`).
            delay = FAKE_TIMING_DELAY if self.limits.fake_timing else 0.0
            self._children.spawn(m, now, delay=delay, cpu=self.placement.take(name))

    def _advance_direct(self, rid: int, d: DirectLoad, now: float) -> None:
        if now < d.not_before:
            return
        d.not_before = 0.0  # slept out: `next_deadline` no longer wakes the core for it
        if self._changes.reloading:
            return
        table = self._table
        m = table.known(d.model)
        if d.victim is None:
            # Parked by a reload: now take upstream's path from the start.
            if m is not None and not m.is_running and not self.has_capacity():
                if any(o.restarting and not o.in_flight for o in table):
                    # A model started again on a narrower lane is chosen from once it is
                    # back: it keeps its place in the LRU order (it may be the victim).
                    return
                victim = pick_victim(table.models, self._queue)
                if victim is not None:
                    chosen = table.models[victim]
                    self._children.stop(chosen, StopCause(StopReason.LRU, d.model), now)
                    d.victim = victim
                    d.victim_gen = chosen.gen
                    return
        else:
            v = table.get(d.victim)
            if v is not None and v.status is not Status.UNLOADED and v.gen == d.victim_gen:
                return  # its child is still going (a restarted victim is not waited for)
        del self._requests.direct[rid]
        if m is None:
            self._out.reply(rid, Failure.not_found("model is not found"))
        elif m.is_running or m.status is not Status.UNLOADED:
            self._out.reply(rid, None)
        elif not self.has_capacity():
            self._out.reply(rid, Failure.server_error("model limit reached, try again later"))
        elif not self.gate.memory_admits(m, now):
            self._requests.direct[rid] = DirectLoad(d.model, d.victim, d.victim_gen)  # freeing
        elif not self.placement.admits(m, now):
            self._requests.direct[rid] = DirectLoad(d.model, None)  # a lane is being freed
        else:
            self._children.spawn(m, now, delay=0.0, cpu=self.placement.take(m.name))
            # Answered at once, before the child has started: a spawn that fails shows as
            # loading -> unloaded (exit code 1) where upstream would answer 500.
            self._out.reply(rid, None)

    def _tick(self, now: float) -> None:
        """Evict idle models while queued requests outnumber free slots (upstream ``tick``);
        when none is idle, note since when the queue starves (see `_start_drain`)."""
        table, queue = self._table, self._queue
        # A drained model whose last request ended goes first: its own waiters then need
        # a slot of their own, counted below in this same tick.
        for m in list(table):
            if m.phase is Phase.DRAINING and m.in_flight == 0:
                self._children.stop(m, StopCause(m.drain_reason, m.drain_for), now)
        need = evictions_needed(table.models, queue, self.limits.models_max)
        # The free slots go to the first entries in line; the evictions are for the rest.
        needy = [
            e.model
            for e in queue.entries
            if not e.loading
            and not (table.models[e.model].is_running and not table.models[e.model].stopping)
        ]
        self._prefetch(needy)
        starving = False
        for model in needy[len(needy) - need :] if need > 0 else []:
            victim = pick_victim(table.models, queue, now=self._clock.demand_now(now))
            if victim is None:
                starving = True  # everything left is busy or pinned
                break
            self._children.stop(table.models[victim], StopCause(StopReason.LRU, model), now)
        draining = any(m.phase is Phase.DRAINING for m in table)
        quiet = not self._requests.closed and not self._changes.reloading and not draining
        self._clock.observe(now, starving=starving, quiet=quiet)

    def _prefetch(self, needy: list[str]) -> None:
        """Each model that waits for a slot has its files read ahead, once per wait."""
        self._prefetched &= set(needy)
        for model in needy:
            if model not in self._prefetched and not self._requests.closed:
                self._prefetched.add(model)
                self._out.add(Prefetch(model))

    def _call_off_drains(self) -> None:
        """A drain whose model no longer waits for a slot (it left, or it got one) ends:
        the model takes leases again, before anyone waiting for it is looked at."""
        for m in self._table:
            if m.phase is not Phase.DRAINING:
                continue
            target = m.drain_for
            assert target is not None
            if m.drain_reason is StopReason.REPLAN:
                # Narrowed while its lane overlaps one given away beside it; called off
                # when that child is gone (it failed, or was stopped meanwhile).
                overlapped = self.placement.must_narrow(m)
                if overlapped is not None:
                    m.drain_for = overlapped  # the child it is narrowed for now
                    continue
            else:
                wanted = self._table.get(target)
                waits = self._queue.find(target) is not None
                if waits and wanted is not None and not wanted.is_running:
                    continue
            m.drain_for = None
            m.drain_reason = StopReason.DRAIN
            m.move(Phase.reporting(m.reported))

    def start_drain(self, now: float) -> None:
        """The queue has starved for ``drain_after``: the busy model with the least demand
        (the least recently used among equals) takes no new lease, and is stopped once
        its requests end (fair admission)."""
        table = self._table
        needy = [
            e.model
            for e in self._queue.entries
            if not e.loading and not table.models[e.model].is_running
        ]
        if not needy:
            self._clock.drained(found=True)
            return
        demand_now = self._clock.demand_now(now)
        victim = pick_victim(table.models, self._queue, busy=True, now=demand_now)
        if victim is None:
            # Nothing busy to drain: the wait was for a model far less in demand that is
            # still loading (see sched.lru); it has been long enough, an idle one goes.
            idle = pick_victim(table.models, self._queue, now=demand_now, hold=False)
            self._clock.drained(found=idle is not None)
            if idle is not None:
                cause = StopCause(StopReason.LRU, needy[0])
                self._children.stop(table.models[idle], cause, now)
            return
        self._clock.drained(found=True)
        m = table.models[victim]
        m.drain_for = needy[0]
        m.drain_reason = StopReason.DRAIN
        m.move(Phase.DRAINING)
        self._out.emit(DrainStarted(victim, needy[0], m.in_flight))

    def measure_next(self) -> None:
        """Start the next measurement, if none runs (one engine process at a time)."""
        if self._projections is None or self._requests.closed:
            return
        fingerprints = {m.name: m.config.fingerprint for m in self._table}
        wanted = self._requests.wanted() + [e.model for e in self._queue.entries]
        self._projections.start_next(fingerprints, wanted)
