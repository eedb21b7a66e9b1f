"""Settling: after every event, who is answered, who loads, and what is evicted.

The waiting rules follow llama.cpp's ``ensure_model_ready`` (spec §6.2-§6.4), applied
the moment something changes instead of every 200 ms.
"""

from __future__ import annotations

from troupe.sched.base import FAKE_TIMING_DELAY, CoreBase, DirectLoad, Waiter
from troupe.sched.effects import Failure
from troupe.sched.lru import evictions_needed, pick_victim
from troupe.sched.status import Status

__all__ = ["Settling"]


class Settling(CoreBase):
    def _settle(self, now: float) -> None:
        """Re-examine every waiter and parked load, then free slots the queue needs."""
        for rid, w in list(self._waiters.items()):
            self._advance(rid, w, now)
        for rid, d in list(self._direct.items()):
            self._advance_direct(rid, d, now)
        self._tick()
        if self._stop_all and not any(m.is_running for m in self._models.values()):
            for rid in self._stop_all:
                self._reply(rid, None)
            self._stop_all.clear()

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
        if m.stopping:
            # A stopping instance takes no new request; the next instance serves it.
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
        if m.spawn_pending:
            return  # claimed; the child is about to start
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
        if not self._reloading and self._queue.can_claim(name) and self._has_capacity():
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
                    return
        else:
            victim_state = self._models.get(d.victim)
            if victim_state is not None and victim_state.status is not Status.UNLOADED:
                return
        del self._direct[rid]
        if m is None or m.removed:
            self._reply(rid, Failure.not_found("model is not found"))
        elif m.is_running or m.status is not Status.UNLOADED:
            self._reply(rid, None)
        elif self._has_capacity():
            self._spawn(m, now, delay=0.0)
            self._reply(rid, None)
        else:
            self._reply(rid, Failure.server_error("model limit reached, try again later"))

    def _needs_victim(self) -> bool:
        return not self._has_capacity()

    def _tick(self) -> None:
        """Evict idle models while queued requests outnumber free slots (upstream ``tick``)."""
        need = evictions_needed(self._models, self._queue, self.models_max)
        while need > 0:
            victim = pick_victim(self._models, self._queue)
            if victim is None:
                return  # everything left is busy or pinned: wait for a request to end
            head = self._queue.entries[0].model if self._queue.entries else "?"
            self._request_stop(self._models[victim], f"lru for {head}")
            need -= 1
