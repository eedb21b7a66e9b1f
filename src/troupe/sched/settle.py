"""Settling: after every event, who is answered, who loads, and what is evicted.

The waiting rules follow llama.cpp's ``ensure_model_ready`` (spec §6.2-§6.4), applied
the moment something changes instead of every 200 ms.
"""

from __future__ import annotations

from troupe.sched.base import FAKE_TIMING_DELAY, DirectLoad, Waiter
from troupe.sched.effects import DeleteFiles, Failure, Prefetch, Reloaded
from troupe.sched.lru import evictions_needed, pick_victim
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig, ModelState
from troupe.sched.views import Views

__all__ = ["Settling"]


class Settling(Views):
    def _settle(self, now: float) -> None:
        """Re-examine every waiter and parked load, then free slots the queue needs."""
        self._now = now
        pending = self._reload
        if pending is not None and not any(
            (m := self._models.get(n)) is not None and m.is_running for n in pending.restart
        ):
            self._finish_reload()
        for rid, model in list(self._removals.items()):
            gone = self._models.get(model)
            if gone is None or not gone.is_running:
                del self._removals[rid]
                self._models.pop(model, None)
                self._forget_measurement(model)
                self._out.append(DeleteFiles(rid, model))
        busy_stopping = any(s.stopping for s in self._models.values())
        if not self._closing and not self._reloading and not busy_stopping:
            for m in list(self._models.values()):
                if m.respawn_after_evictions:  # an out-of-memory load, tried once more
                    m.respawn_after_evictions = False
                    self._spawn(m, now, delay=0.0)
        # Until nothing changes: a waiter looked at before the entry ahead of it emptied
        # must be looked at again now, not at some later, unrelated event.
        while True:
            # Before each pass: a drain whose model left the queue in the pass before
            # ends now, and the drained model's waiters are served in this very settle.
            self._call_off_drains()
            before = (
                [(e.model, e.loading, e.waiters) for e in self._queue.entries],
                len(self._waiters),
            )
            for rid, w in list(self._waiters.items()):
                self._advance(rid, w, now)
            after = (
                [(e.model, e.loading, e.waiters) for e in self._queue.entries],
                len(self._waiters),
            )
            if before == after:
                break
        for rid, d in list(self._direct.items()):
            self._advance_direct(rid, d, now)
        self._tick()
        self._measure_next()
        if self._stop_all and not any(m.is_running for m in self._models.values()):
            for rid in self._stop_all:
                self._reply(rid, None)
            self._stop_all.clear()

    def _finish_reload(self) -> None:
        """Swap in the new model list (§6.9 steps 4-8); called by settling once every
        model the reload stops is gone."""
        pending = self._reload
        assert pending is not None
        self._reload = None
        fresh = {c.name: c for c in pending.models}
        for name, m in list(self._models.items()):
            if name not in fresh:
                self._forget_measurement(name)
                if m.is_running:
                    m.removed = True  # dropped once its child is gone
                    self._request_stop(m, "removed from the catalogue")
                else:
                    del self._models[name]
        for name, config in fresh.items():
            existing = self._models.get(name)
            if existing is None or existing.config.fingerprint != config.fingerprint:
                self._forget_measurement(name)  # a new command line: measured again
                if self._measure is not None and config.need:
                    self._measure.add([name])
            if existing is None:
                self._models[name] = ModelState(config)
                continue
            m = existing
            if self.memory is not None and m.config.fingerprint != config.fingerprint:
                self.memory.effective.pop(name, None)  # seen under another command line
            m.config = config
            if not any(r == name for r in self._removals.values()):
                m.removed = False
            if not m.is_running:
                m.exit_code = 0  # a reload clears "failed"
                m.crashes.clear()
                m.held_until = None
        if self.memory is not None:
            for config in fresh.values():
                self._apply_estimate(config)
        self._emit("*", "models_reload")
        self._out.append(Reloaded(pending.rid, tuple(pending.rids)))
        for rid in pending.rids:
            self._reply(rid, None)

    def _apply_estimate(self, config: ModelConfig) -> None:
        """The best figure known for ``config`` before it runs: the engine's projection
        for this command line, else the catalogue's estimate."""
        assert self.memory is not None
        found = self._measure.of(config.name, config.fingerprint) if self._measure else None
        self.memory.set_estimate(config.name, found.need if found else config.need)

    def _finish(self, rid: int, w: Waiter, result: Failure) -> None:
        del self._waiters[rid]
        if w.queued:
            self._queue.leave(w.model)
        self._reply(rid, result)

    def _advance(self, rid: int, w: Waiter, now: float) -> None:
        """One step of upstream's wait loop for one waiter (§6.2 step 4)."""
        m = self._models.get(w.model)
        name = w.model
        if m is None or m.removed:
            self._finish(rid, w, Failure.server_error(f"model name={name} is not found"))
            return
        if m.stopping or m.draining_for is not None:
            # A stopping (or draining) instance takes no new request; the next one serves
            # it, after the models ahead in line.
            if not w.queued:
                self._queue.join(name)
                w.queued = True
            return
        status = m.status
        if status.is_ready_or_sleeping:
            del self._waiters[rid]
            if w.queued:
                self._queue.leave(name)
            self._grant(rid, m, w.update_last_used, now, waited=True)
            return
        if status in (Status.DOWNLOADING, Status.DOWNLOADED):
            self._finish(rid, w, Failure.bad_request(f"model name={name} is not running"))
            return
        if status is Status.LOADING:
            w.saw_loading = True
            return
        if m.spawn_pending or m.respawn_after_evictions:
            return  # claimed, or tried again after an out-of-memory death
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
        if self._held_back(m, now):
            self._finish(rid, w, Failure.unavailable(self._held_message(m, now)))
            return
        if not self._reloading and self._queue.can_claim(name) and self._admits(m):
            self._queue.claim(name)
            w.did_load = True
            # Upstream's load() sleeps here under LLAMA_SERVER_DEBUG_FAKE_TIMING; the direct
            # POST /models/load path sleeps in the HTTP handler instead.
            self._spawn(m, now, delay=FAKE_TIMING_DELAY if self.fake_timing else 0.0)

    def _advance_direct(self, rid: int, d: DirectLoad, now: float) -> None:
        if self._reloading:
            return
        m = self._models.get(d.model)
        if d.victim is None:
            # Parked by a reload: now take upstream's path from the start.
            if m is not None and not m.removed and not m.is_running and self._needs_victim():
                victim = pick_victim(self._models, self._queue)
                if victim is not None:
                    self._request_stop(self._models[victim], f"lru for {d.model}")
                    d.victim = victim
                    d.victim_gen = self._models[victim].gen
                    return
        else:
            v = self._models.get(d.victim)
            if v is not None and v.status is not Status.UNLOADED and v.gen == d.victim_gen:
                return  # its child is still going (a restarted victim is not waited for)
        del self._direct[rid]
        if m is None or m.removed:
            self._reply(rid, Failure.not_found("model is not found"))
        elif m.is_running or m.status is not Status.UNLOADED:
            self._reply(rid, None)
        elif not self._has_capacity():
            self._reply(rid, Failure.server_error("model limit reached, try again later"))
        elif self._memory_admits(m):
            self._spawn(m, now, delay=0.0)
            # Answered at once, before the child has started: a spawn that fails shows as
            # loading -> unloaded (exit code 1) where upstream would answer 500.
            self._reply(rid, None)
        else:
            self._direct[rid] = DirectLoad(d.model, d.victim, d.victim_gen)  # freeing memory

    def _admits(self, m: ModelState) -> bool:
        """A queued model may load: a free slot and room in memory, or (see
        `_starts_beside_leaving`) a slot whose model is already on its way out."""
        if self._has_capacity():
            return self._memory_admits(m)
        return self._starts_beside_leaving(m)

    def _starts_beside_leaving(self, m: ModelState) -> bool:
        """With fair admission and memory admission on, a model takes the slot of an idle
        one that has been told to exit without waiting for it to be gone, when a reading
        with nothing started since shows room for both (the leaving child still counted):
        a swap costs the next cold start, not that plus the victim's exit. Upstream (and
        ``--drain-after off``) counts a stopping model as running until it exits."""
        ledger = self.memory
        if self.drain_after is None or ledger is None or ledger.need(m.config.name) is None:
            return False
        leaving = sum(
            1 for o in self._models.values() if o.is_running and o.stopping and not o.in_flight
        )
        if self.running_count() - leaving >= self.models_max:
            return False
        if self._measure is not None and self._measure.pending(m.config.name):
            self._measure.bump(m.config.name)  # its projection first, as `_memory_admits`
            return False
        if not (self._sample_fresh() or self._sample_conservative()):
            self._request_sample()  # normally asked for already, when the victim was told
            return False
        assert self._sample is not None
        return not ledger.deficit(m.config.name, self._sample, self._memory_holders())

    def _needs_victim(self) -> bool:
        return not self._has_capacity()

    def _memory_admits(self, m: ModelState) -> bool:
        """Does ``m`` fit in memory with the margin? If not, ask for what it takes (a fresh
        sample, one eviction at a time) and answer False: the caller waits."""
        ledger = self.memory
        name = m.config.name
        if ledger is None:
            return True
        if (
            self._measure is not None
            and self._measure.pending(name)
            and not ledger.effective.get(name)
        ):
            # Measured first (the engine's projection takes a fraction of a second;
            # a failure or a timeout falls back to the estimate).
            assert self._measure is not None
            self._measure.bump(name)
            return False
        if ledger.need(name) is None:
            return True  # unknown need: load without the check, learn it once it is up
        holders = self._memory_holders()
        if not self._sample_fresh():
            if self._sample_failed_version == self._mem_version:
                warning = "loading without the memory check: memory could not be read"
                self._emit(name, "troupe_memory", {"warning": warning})
                return True
            if self._sample_conservative():
                assert self._sample is not None
                if not ledger.deficit(name, self._sample, holders):
                    return True  # it fitted before a child exited: it fits now
            self._request_sample()
            return False
        assert self._sample is not None
        deficit = ledger.deficit(name, self._sample, holders)
        if not deficit:
            return True
        if any(s.stopping for s in self._models.values()):
            return False  # one eviction at a time: wait until it is gone
        victim = pick_victim(self._models, self._queue, exclude=(name,))
        if victim is not None:
            self._request_stop(self._models[victim], f"memory for {name}")
            return False
        if not any(h != name for h in holders):
            # Nothing else to give up: load anyway, as upstream does, but say so.
            short = ", ".join(f"{dev}: {n >> 20} MiB" for dev, n in sorted(deficit.items()))
            warning = f"loading without enough memory ({short} short)"
            self._emit(name, "troupe_memory", {"warning": warning})
            return True
        return False  # busy or pinned models hold the memory: wait for one to go idle

    def _tick(self) -> None:
        """Evict idle models while queued requests outnumber free slots (upstream ``tick``);
        when none is idle, note since when the queue starves (see `_start_drain`)."""
        # A drained model whose last request ended goes first: its own waiters then need
        # a slot of their own, counted below in this same tick.
        for m in self._models.values():
            if m.draining_for is not None and m.in_flight == 0 and not m.stopping:
                self._request_stop(m, f"drain for {m.draining_for}")
        need = evictions_needed(self._models, self._queue, self.models_max)
        # The free slots go to the first entries in line; the evictions are for the rest.
        needy = [
            e.model
            for e in self._queue.entries
            if not e.loading
            and not (self._models[e.model].is_running and not self._models[e.model].stopping)
        ]
        self._prefetch(needy)
        starving = False
        for model in needy[len(needy) - need :] if need > 0 else []:
            victim = pick_victim(self._models, self._queue, now=self._demand_now)
            if victim is None:
                starving = True  # everything left is busy or pinned
                break
            self._request_stop(self._models[victim], f"lru for {model}")
        draining = [m for m in self._models.values() if m.draining_for is not None]
        quiet = not self._closing and not self._reloading and not self._drain_futile
        if starving and not draining and quiet:
            if self._starved_since is None:
                self._starved_since = self._now
        else:
            self._starved_since = None

    def _prefetch(self, needy: list[str]) -> None:
        """Each model that waits for a slot has its files read ahead, once per wait."""
        self._prefetched &= set(needy)
        for model in needy:
            if model not in self._prefetched and not self._closing:
                self._prefetched.add(model)
                self._out.append(Prefetch(model))

    @property
    def _demand_now(self) -> float | None:
        """With fair admission, victims are chosen by demand (see sched.lru); without,
        exactly as upstream."""
        return self._now if self.drain_after is not None else None

    def _call_off_drains(self) -> None:
        """A drain whose model no longer waits for a slot (it left, or it got one) ends:
        the model takes leases again, before anyone waiting for it is looked at."""
        for m in self._models.values():
            target = m.draining_for
            if target is None or m.stopping:
                continue
            entry = self._queue.find(target)
            wanted = self._models.get(target)
            if entry is None or wanted is None or wanted.is_running:
                m.draining_for = None

    def _start_drain(self) -> None:
        """The queue has starved for ``drain_after``: the busy model with the least demand
        (the least recently used among equals) takes no new lease, and is stopped once
        its requests end (fair admission)."""
        self._starved_since = None
        needy = [
            e.model
            for e in self._queue.entries
            if not e.loading and not self._models[e.model].is_running
        ]
        if not needy:
            return
        victim = pick_victim(self._models, self._queue, busy=True, now=self._demand_now)
        if victim is None:
            # Nothing busy to drain: the wait was for a model far less in demand that is
            # still loading (see sched.lru); it has been long enough, an idle one goes.
            idle = pick_victim(self._models, self._queue, now=self._demand_now, hold=False)
            if idle is not None:
                self._request_stop(self._models[idle], f"lru for {needy[0]}")
                return
            self._drain_futile = True  # only pinned models hold the slots: no timer again
            return
        m = self._models[victim]
        m.draining_for = needy[0]
        self._emit(victim, "troupe_drain", {"for": needy[0], "in_flight": m.in_flight})
