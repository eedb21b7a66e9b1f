"""`SchedulerCore`: the model table and every decision about it, with no Trio and no I/O.

Each public method is one event (a request arrives, a child reports a state, time
passes); it updates the table and returns the effects for the actor to carry out.
The waiting rules follow llama.cpp's ``ensure_model_ready`` (spec §6.2-§6.4), but
a waiter is re-examined the moment something changes instead of every 200 ms.
"""

from __future__ import annotations

from typing import Any

from troupe.sched.base import TRUE_UP_DELAY, DirectLoad, Waiter
from troupe.sched.effects import Effect, Failure
from troupe.sched.lru import pick_victim, record_demand
from troupe.sched.measuring import MAX_ATTEMPTS
from troupe.sched.memory_events import MemoryEvents
from troupe.sched.status import Status
from troupe.sched.table import ModelState

__all__ = ["SchedulerCore"]


class SchedulerCore(MemoryEvents):
    """The single writer of the model table (DESIGN principle 1)."""

    # ----- requests -----------------------------------------------------------------

    def acquire(
        self,
        rid: int,
        model: str,
        now: float,
        *,
        autoload: bool = True,
        update_last_used: bool = True,
        ready_only: bool = False,
    ) -> list[Effect]:
        """A request wants to use ``model``; answered now or when the model is ready.
        ``ready_only``: answered now either way, with a lease only if it is loaded."""
        m = self._models.get(model)
        if self._closing:
            self._reply(rid, Failure.unavailable("server is shutting down"))
        elif m is None or m.removed:
            self._reply(rid, Failure.server_error(f"model name={model} is not found"))
        elif ready_only:
            if m.status is Status.LOADED and not m.stopping:
                self._grant(rid, m, update_last_used, now, waited=False)
            else:
                self._reply(rid, Failure.not_found(f"model name={model} is not loaded"))
        elif not autoload:
            # Upstream proxies to any running child without waiting, even one still loading
            # (which answers 503 itself); one not started yet has no port to proxy to.
            if m.status.is_running and m.spawn_pending:
                self._reply(rid, Failure.unavailable("Loading model"))
            elif m.status.is_running:
                self._grant(rid, m, update_last_used, now, waited=False)
            else:
                self._reply(rid, Failure.bad_request("model is not loaded"))
        elif not m.stopping and m.draining_for is None and m.status.is_ready_or_sleeping:
            if update_last_used:
                record_demand(m, now)
            self._grant(rid, m, update_last_used, now, waited=False)
        elif self._held_back(m, now):
            self._reply(rid, Failure.unavailable(self._held_message(m, now)))
        elif self.queue_max > 0 and len(self._waiters) >= self.queue_max:
            self._reply(rid, self._queue_full(model))
        else:
            if update_last_used:
                record_demand(m, now)
            w = Waiter(model, update_last_used)
            self._waiters[rid] = w
            if m.status is Status.UNLOADED:
                # The queue entry protects the model from eviction until its waiters leave.
                self._queue.join(model)
                w.queued = True
            self._settle(now)
        return self._flush()

    def grants_at_once(self, model: str, autoload: bool = True, ready_only: bool = False) -> bool:
        """Would `acquire` answer with a lease right away (and change nothing else)?"""
        m = self._models.get(model)
        if self._closing or m is None or m.removed:
            return False
        if ready_only:
            return m.status is Status.LOADED and not m.stopping
        if autoload:
            return not m.stopping and m.draining_for is None and m.status.is_ready_or_sleeping
        return m.status.is_running and not m.spawn_pending

    def release(self, rid: int, now: float) -> list[Effect]:
        """A request is done with its lease, or gave up waiting (disconnect, timeout)."""
        lease = self._leases.pop(rid, None)
        if lease is not None:
            m = self._models.get(lease.model)
            if m is not None and m.gen == lease.gen and m.in_flight > 0:
                m.in_flight -= 1
                if m.in_flight == 0:
                    m.idle_since = now
        w = self._waiters.pop(rid, None)
        if w is not None and w.queued:
            self._queue.leave(w.model)  # a slot freed for this waiter goes to the next one
        self._direct.pop(rid, None)
        self._settle(now)
        return self._flush()

    def load(self, rid: int, model: str, now: float) -> list[Effect]:
        """``POST /models/load``: evict the LRU model and wait for it, then spawn (§3.4)."""
        m = self._models.get(model)
        if self._closing:
            self._reply(rid, Failure.unavailable("server is shutting down"))
        elif m is None or m.removed:
            self._reply(rid, Failure.not_found("model is not found"))
        elif m.is_running:
            self._reply(rid, Failure.bad_request("model is already running"))
        elif m.status is not Status.UNLOADED:
            self._reply(rid, None)  # downloading/downloaded: upstream silently does nothing
        else:
            m.crashes.clear()  # an explicit load lifts a crash-loop hold
            m.held_until = None
            # Settling takes upstream's path: spawn if a slot is free, else stop the LRU
            # model and wait for it to be gone (or answer "model limit reached"); it also
            # waits out a reload and, with memory admission, frees memory first.
            self._direct[rid] = DirectLoad(model, None)
            self._settle(now)
        return self._flush()

    def unload(self, rid: int, model: str, now: float) -> list[Effect]:
        """``POST /models/unload``: start the stop and answer without waiting (§3.4)."""
        m = self._models.get(model)
        if m is None or m.removed:
            self._reply(rid, Failure.bad_request("model is not found"))
        elif not m.status.is_running:
            if m.respawn_after_evictions:
                m.respawn_after_evictions = False  # the OOM retry is called off; waiters fail
                self._settle(now)
            self._reply(rid, Failure.bad_request("model is not running"))
        else:
            self._request_stop(m, "unload request")
            self._reply(rid, None)
            self._settle(now)
        return self._flush()

    # ----- child events ---------------------------------------------------------------

    def spawned(self, model: str, gen: int, port: int, pid: int, now: float) -> list[Effect]:
        m = self._current(model, gen)
        if m is not None and m.spawn_pending:
            m.spawn_pending = False
            m.port, m.pid = port, pid
            if m.status is Status.UNLOADED:  # a delayed spawn: loading starts only now
                self._mark_loading(m, now)
            self._memory_changed()
            self._settle(now)
        return self._flush()

    def child_state(
        self, model: str, gen: int, state: str, payload: Any, now: float
    ) -> list[Effect]:
        """A ``cmd_child_to_router:state:`` line; an unknown state is ignored."""
        m = self._current(model, gen)
        if m is None or not m.status.is_running:
            return self._flush()
        data: dict[str, Any]
        if state == "loading":
            m.status = Status.LOADING
            m.exit_code = 0
            m.progress = payload if isinstance(payload, dict) else None
            data = {"status": "loading"}
            if payload is not None:
                data["progress"] = payload
        elif state == "ready":
            m.status = Status.LOADED
            m.exit_code = 0
            m.progress = None
            data = {"status": "loaded"}
            if payload:  # upstream: any non-empty payload is the info
                data["info"] = payload
                if isinstance(payload, dict):
                    m.loaded_info = payload
            if m.load_started is not None:
                m.last_load_seconds = now - m.load_started
                m.load_started = None
            if m.in_flight == 0:
                m.idle_since = now
            m.oom_retried = False
            self._memory_changed()
            if self.memory is not None:
                self._true_up_due = now + TRUE_UP_DELAY  # learn what it really holds, soon
                self._true_up_version = self._mem_version
            self._measure_again(model)
        elif state == "sleeping":
            m.status = Status.SLEEPING
            m.exit_code = 0
            data = {"status": "sleeping"}
            self._memory_changed(released=True)  # a sleeping child gives its memory back
        else:
            return self._flush()
        self._emit(model, "status_change", data)
        self._settle(now)
        return self._flush()

    def exited(
        self,
        model: str,
        gen: int,
        code: int,
        now: float,
        *,
        expected: bool,
        detail: str | None = None,
        oom: bool = False,
    ) -> list[Effect]:
        """The child of generation ``gen`` is gone. ``code`` is upstream's (a signal is 1);
        ``oom``: its log said it ran out of memory."""
        self._now = now
        m = self._current(model, gen)
        if m is None:
            return self._flush()
        was_running = m.status.is_running
        was_loading = m.status is Status.LOADING
        entry = self._queue.find(model)
        if entry is not None and entry.loading:
            # The claimed load died: the entry is back in line, so its other waiters (and
            # everyone queued behind it) are not stranded behind a claim that is over.
            self._queue.claim_failed(model)
        self._memory_changed(released=True)
        m.status = Status.UNLOADED
        m.exit_code = code
        m.stopping = False
        m.draining_for = None
        m.spawn_pending = False
        m.in_flight = 0  # leases on the dead child no longer count (see release)
        m.progress = None
        m.load_started = None
        if detail:
            m.last_error = detail
        if was_running:
            self._emit(model, "status_change", {"status": "unloaded", "exit_code": code})
            # troupe's own: did troupe ask for it, and was it OOM (metrics, logs, dashboard)
            self._emit(model, "troupe_exit", {"exit_code": code, "expected": expected, "oom": oom})
        if oom and was_loading and not expected and self._retry_after_oom(m):
            pass  # its waiters keep waiting for the second try
        elif not expected:
            self._record_crash(m, now)
        if m.removed:
            del self._models[model]
        self._settle(now)
        return self._flush()

    def _measure_again(self, model: str) -> None:
        """A model whose measurement failed is measured again once it loaded (twice at
        most): a projection made with the child up may well work."""
        queue = self._measure
        if queue is None:
            return
        tries = queue.failures.get(model, 0)
        if 0 < tries < MAX_ATTEMPTS and not queue.pending(model):
            queue.add([model])

    def _retry_after_oom(self, m: ModelState) -> bool:
        """A load that died of OOM while idle models were resident: evict them all and try
        once more. True when that retry is under way."""
        if m.oom_retried or m.removed:
            return False
        victims: list[str] = []
        while True:
            victim = pick_victim(self._models, self._queue, exclude=[m.config.name, *victims])
            if victim is None:
                break
            victims.append(victim)
        if not victims:
            return False
        for victim in victims:
            self._request_stop(self._models[victim], f"memory for {m.config.name}")
        m.oom_retried = True
        m.respawn_after_evictions = True
        return True

    # ----- time -------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `on_time` next has something to do (a TTL expiry, a drain); None if never."""
        deadlines = [
            m.idle_since + m.config.ttl
            for m in self._models.values()
            if self._ttl_candidate(m) and m.config.ttl is not None
        ]
        if self._starved_since is not None and self.drain_after is not None:
            deadlines.append(self._starved_since + self.drain_after)
        if self._true_up_due is not None:
            deadlines.append(self._true_up_due)
        return min(deadlines, default=None)

    def start(self, now: float) -> list[Effect]:
        """The scheduler is up: what waits for no request starts now (the engine's memory
        projections, so a model's first load need not wait for its own)."""
        self._settle(now)
        return self._flush()

    def on_time(self, now: float) -> list[Effect]:
        self._now = now
        for m in self._models.values():
            ttl = m.config.ttl
            if ttl is not None and self._ttl_candidate(m) and m.idle_since + ttl <= now:
                self._request_stop(m, "ttl")
        if (
            self._starved_since is not None
            and self.drain_after is not None
            and now >= self._starved_since + self.drain_after
        ):
            self._start_drain()
        if self._true_up_due is not None and now >= self._true_up_due:
            self._true_up_due = None
            self._request_sample()
        self._settle(now)
        return self._flush()
