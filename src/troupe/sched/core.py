"""`SchedulerCore`: the model table and every decision about it, with no Trio and no I/O.

Each public method is one event (a request arrives, a child reports a state, time
passes); it updates the table and returns the effects for the actor to carry out.
The core is a composition of small parts, each owning its own state:

- `ModelTable` (table.py): every model's lifecycle phase (phase.py) and data;
- `AdmissionQueue` (queue.py) and `Requests` (requests.py): who waits, who holds a lease;
- `Children` (children.py): the only place that spawns and stops; `CrashRecord`: holds;
- `MemoryAdmission` (admission.py) and `MeasureQueue` (measuring.py): memory;
- `DrainClock` (drain.py): fair admission's timer and swap count;
- `CatalogueChanges` (reloads.py): reloads and removals under way;
- `Settler` (settle.py): after each event, who is answered, who loads, who goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from troupe.sched.admission import MemoryAdmission
from troupe.sched.children import Children, CrashRecord, at_rest, lift_hold
from troupe.sched.drain import DrainClock
from troupe.sched.effects import CancelMeasure, Effect, Failure
from troupe.sched.events import ChildExited, MemoryProjected, ProjectionFailed, StatusChanged
from troupe.sched.lru import pick_victim, record_demand
from troupe.sched.measuring import MAX_ATTEMPTS, MeasureQueue, Projection
from troupe.sched.memory import MemoryLedger, MemorySample
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.reloads import CatalogueChanges
from troupe.sched.requests import DirectLoad, Requests, Waiter
from troupe.sched.settle import Limits, Settler, serving
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig, ModelState, ModelTable, Snapshot
from troupe.sched.views import QueueReporter, Situation, model_views

__all__ = ["DEFAULT_LOAD_SECONDS", "SchedulerCore"]

DEFAULT_LOAD_SECONDS = 10.0  # a load never measured yet, for Retry-After
_REPORTED = {"loading": Status.LOADING, "ready": Status.LOADED, "sleeping": Status.SLEEPING}


class SchedulerCore:
    """The single writer of the model table (DESIGN principle 1)."""

    def __init__(
        self,
        models: Iterable[ModelConfig],
        models_max: int,
        *,
        fake_timing: bool = False,
        crash_limit: int = 3,
        crash_window: float = 60.0,
        queue_max: int = 0,
        memory: MemoryLedger | None = None,
        drain_after: float | None = None,
        measure: bool = False,
    ) -> None:
        self.limits = Limits(models_max, queue_max, fake_timing)
        self.table = ModelTable(models)
        self.queue = AdmissionQueue()
        self.requests = Requests()
        self.changes = CatalogueChanges()
        self.outbox = Outbox()
        # A queued model that gets no slot because every loaded model is busy waits at
        # most ``drain_after`` before the busy one with the least demand is drained for
        # it (None: never, as upstream, whose rare models wait while popular ones stay busy).
        self.clock = DrainClock(drain_after)
        self.crashes = CrashRecord(crash_limit, crash_window)
        # Memory admission (None: count limit only), and the engine's own projections.
        self.memory = MemoryAdmission(memory) if memory is not None else None
        self.measure = MeasureQueue() if measure and memory is not None else None
        self.children = Children(self.table, self.outbox, self.clock, self.memory)
        self.settler = Settler(
            self.limits,
            self.table,
            self.queue,
            self.requests,
            self.changes,
            self.children,
            self.crashes,
            self.clock,
            self.memory,
            self.measure,
            self.outbox,
        )
        self._reporter = QueueReporter()
        self._now = 0.0  # the time of the event being handled
        self._version = 0
        if memory is not None:
            for m in self.table:
                memory.set_estimate(m.name, m.config.need)
        if self.measure is not None:
            # Only what troupe could read itself: the engine cannot project a file whose
            # header is not a model's either (it would fail after starting a process).
            self.measure.add(sorted(m.name for m in self.table if m.config.need))

    @property
    def models_max(self) -> int:
        return self.limits.models_max

    @property
    def drain_after(self) -> float | None:
        return self.clock.drain_after

    @property
    def ledger(self) -> MemoryLedger | None:
        return self.memory.ledger if self.memory is not None else None

    def running_names(self) -> list[str]:
        return self.table.running_names()

    def running_count(self) -> int:
        return self.table.running_count()

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
        self._now = now
        m = self.table.known(model)
        out = self.outbox
        if self.requests.closed:
            out.reply(rid, Failure.unavailable("server is shutting down"))
        elif m is None:
            out.reply(rid, Failure.server_error(f"model name={model} is not found"))
        elif ready_only:
            if m.status is Status.LOADED and not m.stopping:
                self.settler.grant(rid, m, update_last_used, now, waited=False)
            else:
                out.reply(rid, Failure.not_found(f"model name={model} is not loaded"))
        elif not autoload:
            # Upstream proxies to any running child without waiting, even one still loading
            # (which answers 503 itself); one not started yet has no port to proxy to.
            if m.status.is_running and m.spawn_pending:
                out.reply(rid, Failure.unavailable("Loading model"))
            elif m.status.is_running:
                self.settler.grant(rid, m, update_last_used, now, waited=False)
            else:
                out.reply(rid, Failure.bad_request("model is not loaded"))
        elif m.phase.serves:
            if update_last_used:
                record_demand(m, now)
            self.settler.grant(rid, m, update_last_used, now, waited=False)
        elif self.crashes.held_back(m, now):
            out.reply(rid, Failure.unavailable(self.crashes.message(m, now)))
        elif self.limits.queue_max > 0 and len(self.requests.waiters) >= self.limits.queue_max:
            out.reply(rid, self._queue_full(model))
        else:
            if update_last_used:
                record_demand(m, now)
            w = Waiter(model, update_last_used)
            self.requests.waiters[rid] = w
            if m.status is Status.UNLOADED:
                # The queue entry protects the model from eviction until its waiters leave.
                self.queue.join(model)
                w.queued = True
            self._settle(now)
        return self._flush()

    def grants_at_once(self, model: str, autoload: bool = True, ready_only: bool = False) -> bool:
        """Would `acquire` answer with a lease right away (and change nothing else)?"""
        m = self.table.known(model)
        if self.requests.closed or m is None:
            return False
        if ready_only:
            return m.status is Status.LOADED and not m.stopping
        if autoload:
            return m.phase.serves
        return m.status.is_running and not m.spawn_pending

    def release(self, rid: int, now: float) -> list[Effect]:
        """A request is done with its lease, or gave up waiting (disconnect, timeout)."""
        requests = self.requests
        lease = requests.leases.pop(rid, None)
        if lease is not None:
            m = self.table.current(lease.model, lease.gen)
            if m is not None and m.in_flight > 0:
                m.in_flight -= 1
                if m.in_flight == 0:
                    m.idle_since = now
        w = requests.waiters.pop(rid, None)
        if w is not None and w.queued:
            self.queue.leave(w.model)  # a slot freed for this waiter goes to the next one
        requests.direct.pop(rid, None)
        self._settle(now)
        return self._flush()

    def load(self, rid: int, model: str, now: float) -> list[Effect]:
        """``POST /models/load``: evict the LRU model and wait for it, then spawn (§3.4)."""
        m = self.table.known(model)
        out = self.outbox
        if self.requests.closed:
            out.reply(rid, Failure.unavailable("server is shutting down"))
        elif m is None:
            out.reply(rid, Failure.not_found("model is not found"))
        elif m.is_running:
            out.reply(rid, Failure.bad_request("model is already running"))
        else:
            m.crashes.clear()  # an explicit load lifts a crash-loop hold
            lift_hold(m)
            # Settling takes upstream's path: spawn if a slot is free, else stop the LRU
            # model and wait for it to be gone (or answer "model limit reached"); it also
            # waits out a reload and, with memory admission, frees memory first.
            self.requests.direct[rid] = DirectLoad(model, None)
            self._settle(now)
        return self._flush()

    def unload(self, rid: int, model: str, now: float) -> list[Effect]:
        """``POST /models/unload``: start the stop and answer without waiting (§3.4)."""
        m = self.table.known(model)
        out = self.outbox
        if m is None:
            out.reply(rid, Failure.bad_request("model is not found"))
        elif not m.status.is_running:
            if m.phase is Phase.RETRYING:
                m.move(at_rest(m))  # the OOM retry is called off; its waiters fail
                self._settle(now)
            out.reply(rid, Failure.bad_request("model is not running"))
        else:
            self.children.stop(m, StopCause(StopReason.UNLOAD), now)
            out.reply(rid, None)
            self._settle(now)
        return self._flush()

    # ----- child events ---------------------------------------------------------------

    def spawned(self, model: str, gen: int, port: int, pid: int, now: float) -> list[Effect]:
        m = self.table.current(model, gen)
        if m is not None and m.spawn_pending:
            self.children.started(m, port, pid, now)
            self._settle(now)
        return self._flush()

    def child_state(
        self, model: str, gen: int, state: str, payload: Any, now: float
    ) -> list[Effect]:
        """A ``cmd_child_to_router:state:`` line; an unknown state is ignored."""
        m = self.table.current(model, gen)
        reported = _REPORTED.get(state)
        if m is None or reported is None or not m.status.is_running or m.spawn_pending:
            return self._flush()
        m.reported = reported
        m.exit_code = 0
        if m.phase not in (Phase.DRAINING, Phase.STOPPING):
            m.move(serving(m))  # a draining or stopping child keeps its course
        event = StatusChanged(model, reported)
        if reported is Status.LOADING:
            m.progress = payload if isinstance(payload, dict) else None
            event = StatusChanged(model, reported, progress=payload)
        elif reported is Status.LOADED:
            self._came_up(m, payload, now)
            # Upstream: any non-empty payload is the info.
            event = StatusChanged(model, reported, info=payload or None)
        elif self.memory is not None:
            self.memory.changed(released=True)  # a sleeping child gives its memory back
        self.outbox.emit(event)
        self._settle(now)
        return self._flush()

    def _came_up(self, m: ModelState, payload: Any, now: float) -> None:
        m.progress = None
        if payload and isinstance(payload, dict):
            m.loaded_info = payload
        if m.load_started is not None:
            m.last_load_seconds = now - m.load_started
            m.load_started = None
        if m.in_flight == 0:
            m.idle_since = now
        m.oom_retried = False
        if self.memory is not None:
            self.memory.changed()
            self.memory.came_up(now)
        self._measure_again(m.name)

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
        m = self.table.current(model, gen)
        if m is None or not m.is_running:
            return self._flush()
        was_running = m.status.is_running
        was_loading = m.status is Status.LOADING
        was_stopping = m.stopping
        entry = self.queue.find(model)
        if entry is not None and entry.loading:
            # The claimed load died: the entry is back in line, so its other waiters (and
            # everyone queued behind it) are not stranded behind a claim that is over.
            self.queue.claim_failed(model)
        if self.memory is not None:
            self.memory.changed(released=True)
        m.reported = Status.UNLOADED
        m.exit_code = code
        m.drain_for = None
        m.in_flight = 0  # leases on the dead child no longer count (see release)
        m.progress = None
        m.load_started = None
        if detail:
            m.last_error = detail
        victims = self._oom_victims(m) if oom and was_loading and not expected else []
        if victims and not was_stopping:
            m.move(Phase.RETRYING)  # its waiters keep waiting for the second try
        elif not expected and self.crashes.crashed(m, now):
            m.move(Phase.HELD)
        else:
            m.move(at_rest(m))
        if was_running:
            self.outbox.emit(StatusChanged(model, Status.UNLOADED, exit_code=code))
            # troupe's own: did troupe ask for it, and was it OOM (metrics, logs, dashboard)
            self.outbox.emit(ChildExited(model, code, expected, oom))
        if m.phase is Phase.RETRYING:
            # A load that died of OOM while idle models were resident: evict them all and
            # try once more.
            m.oom_retried = True
            for victim in victims:
                cause = StopCause(StopReason.MEMORY, model)
                self.children.stop(self.table.models[victim], cause, now)
        if self.table.retiring(model):
            self.table.drop(model)
        self._settle(now)
        return self._flush()

    def _measure_again(self, model: str) -> None:
        """A model whose measurement failed is measured again once it loaded (twice at
        most): a projection made with the child up may well work."""
        queue = self.measure
        if queue is None:
            return
        tries = queue.failures.get(model, 0)
        if 0 < tries < MAX_ATTEMPTS and not queue.pending(model):
            queue.add([model])

    def _oom_victims(self, m: ModelState) -> list[str]:
        """The idle models to evict so that a load that died of OOM may be tried once
        more (none if it was tried again already, or is leaving the table)."""
        if m.oom_retried or self.table.retiring(m.name):
            return []
        victims: list[str] = []
        while True:
            victim = pick_victim(self.table.models, self.queue, exclude=[m.name, *victims])
            if victim is None:
                return victims
            victims.append(victim)

    # ----- the table as a whole: shutdown, reload, removal ------------------------------------

    def _close(self) -> None:
        """Shutting down: no new lease or load, and everyone waiting is answered."""
        requests = self.requests
        requests.closed = True
        for wid, w in list(requests.waiters.items()):
            if w.queued:
                self.queue.leave(w.model)
            del requests.waiters[wid]
            self.outbox.reply(wid, Failure.unavailable("server is shutting down"))
        for did in list(requests.direct):
            del requests.direct[did]
            self.outbox.reply(did, Failure.unavailable("server is shutting down"))

    def stop_all(self, rid: int, now: float) -> list[Effect]:
        """Shutdown: fail every waiter, stop every child, answer when none runs."""
        self._close()
        for m in list(self.table):
            self.children.stop(m, StopCause(StopReason.SHUTDOWN), now)
        self._cancel_measurements()
        self.requests.stop_all.append(rid)
        self._settle(now)
        return self._flush()

    def drain(self, now: float) -> list[Effect]:
        """Shutdown begins: requests holding a lease finish, nothing else starts. Every
        waiter and parked load is answered at once, and loads under way are killed (no
        one waits for them); loaded children stay up until `stop_all`."""
        self._close()
        for m in list(self.table):
            if m.phase is Phase.RETRYING:
                m.move(at_rest(m))
            if m.status is Status.LOADING or m.spawn_pending:
                self.children.stop(m, StopCause(StopReason.SHUTDOWN), now)
        self._cancel_measurements()
        self._settle(now)
        return self._flush()

    def _cancel_measurements(self) -> None:
        if self.measure is not None:
            self.measure.todo.clear()
            if self.measure.running is not None:
                self.outbox.add(CancelMeasure(self.measure.running[0]))
                self.measure.running = None

    def reload(
        self, rid: int, restart: Iterable[str], models: Iterable[ModelConfig], now: float
    ) -> list[Effect]:
        """A reload (§6.9): loads wait, the running models in ``restart`` (preset changed
        or gone) are stopped, and once none of them runs ``models`` becomes the table and
        ``rid`` is answered. A reload asked for meanwhile is folded in: its catalogue,
        read later, wins, and both are answered together."""
        names = set(restart)
        self.changes.fold(rid, names, models)
        for name in sorted(names):
            m = self.table.get(name)
            if m is not None:
                self.children.stop(m, StopCause(StopReason.RELOAD), now)
        self._settle(now)
        return self._flush()

    def remove(self, rid: int, model: str, now: float) -> list[Effect]:
        """``DELETE /models`` (§8): stop ``model``, then have its files deleted. From now on
        requests for it fail as for an unknown model; the reload after the deletion
        brings back whatever is left of it."""
        m = self.table.known(model)
        if m is None:
            self.outbox.reply(rid, Failure.server_error(f"model name={model} is not found"))
            return self._flush()
        self.table.retire(model)
        self.children.stop(m, StopCause(StopReason.REMOVE), now)
        self.changes.removals[rid] = model
        self._settle(now)
        return self._flush()

    # ----- memory -------------------------------------------------------------------------

    def set_estimate(self, model: str, need: Mapping[str, int] | None, now: float) -> list[Effect]:
        """What loading ``model`` is expected to take per device (None: unknown)."""
        if self.memory is not None:
            self.memory.ledger.set_estimate(model, need)
            self._settle(now)
        return self._flush()

    def memory_sampled(self, sample: MemorySample, version: int, now: float) -> list[Effect]:
        """A reading asked for by a `SampleMemory` effect of the same ``version``."""
        if self.memory is not None:
            self.memory.took(sample, version, self.table)
        self._settle(now)
        return self._flush()

    def memory_sample_failed(self, version: int, now: float) -> list[Effect]:
        """The reading asked for by a `SampleMemory` of ``version`` could not be made.
        As upstream settles a failed measurement: loads waiting for it go ahead without
        the memory check (until the next change asks for a new reading)."""
        if self.memory is not None:
            self.memory.could_not_read(version)
        self._settle(now)
        return self._flush()

    def measured(
        self,
        model: str,
        fingerprint: str,
        need: Mapping[str, int],
        high: Mapping[str, int] | None,
        now: float,
    ) -> list[Effect]:
        """The engine's projection for ``model`` under ``fingerprint`` (a `Measure`)."""
        queue = self.measure
        if queue is not None and queue.finish(model, fingerprint):
            m = self.table.get(model)
            if m is not None and m.config.fingerprint == fingerprint and any(need.values()):
                queue.projected[model] = Projection(fingerprint, dict(need), high)
                self.settler.apply_estimate(m.config)
                self.outbox.emit(MemoryProjected(model, dict(need)))
        self._settle(now)
        return self._flush()

    def measure_failed(self, model: str, fingerprint: str, reason: str, now: float) -> list[Effect]:
        """The engine could not project ``model``: the estimate stands (upstream settles a
        failed measurement: the load goes on), and it is measured again after a load."""
        queue = self.measure
        if queue is not None and queue.finish(model, fingerprint):
            queue.failed(model)
            self.outbox.emit(ProjectionFailed(model, reason))
        self._settle(now)
        return self._flush()

    # ----- time -------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `on_time` next has something to do (a TTL expiry, a drain); None if never."""
        deadlines = [
            m.idle_since + m.config.ttl
            for m in self.table
            if m.config.ttl is not None and self._ttl_candidate(m)
        ]
        drain = self.clock.deadline()
        if drain is not None:
            deadlines.append(drain)
        if self.memory is not None and (due := self.memory.deadline()) is not None:
            deadlines.append(due)
        return min(deadlines, default=None)

    def start(self, now: float) -> list[Effect]:
        """The scheduler is up: what waits for no request starts now (the engine's memory
        projections, so a model's first load need not wait for its own)."""
        self._settle(now)
        return self._flush()

    def on_time(self, now: float) -> list[Effect]:
        self._now = now
        for m in list(self.table):
            ttl = m.config.ttl
            if ttl is not None and self._ttl_candidate(m) and m.idle_since + ttl <= now:
                self.children.stop(m, StopCause(StopReason.TTL), now)
        if self.clock.due(now):
            self.settler.start_drain(now)
        if self.memory is not None and self.memory.true_up_due(now):
            self.children.ask_memory()
        self._settle(now)
        return self._flush()

    def _ttl_candidate(self, m: ModelState) -> bool:
        return (
            m.phase.serves
            and not m.config.pin  # pinned means never unloaded on troupe's own initiative
            and m.in_flight == 0
            and self.queue.find(m.name) is None
        )

    # ----- views ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        self._version += 1
        return Snapshot(
            version=self._version,
            models=model_views(
                self.table, self.queue, self._situation(), self.memory, self.measure
            ),
            models_max=self.limits.models_max,
            queue=tuple((e.model, e.waiters) for e in self.queue.entries),
            devices=self.memory.sample.devices if self.memory and self.memory.sample else (),
            recent_swaps=self.clock.recent_swaps(self._now),
        )

    def _situation(self) -> Situation:
        return Situation(self.changes.reloading, self.settler.has_capacity())

    def _queue_full(self, model: str) -> Failure:
        """503 with a Retry-After from the measured load times of the models ahead."""
        ahead = [e.model for e in self.queue.entries]
        if model not in ahead:
            ahead.append(model)
        seconds = 0.0
        for name in ahead:
            m = self.table.get(name)
            load = m.last_load_seconds if m is not None else None
            seconds += load if load is not None else DEFAULT_LOAD_SECONDS
        message = (
            f"too many requests waiting for models ({len(self.requests.waiters)}, --queue-max "
            f"{self.limits.queue_max}); retry in {max(1, round(seconds))} s"
        )
        return Failure(503, message, "unavailable_error", retry_after=max(1.0, seconds))

    def _settle(self, now: float) -> None:
        self._now = now
        self.settler.settle(now)

    def _flush(self) -> list[Effect]:
        self._reporter.report(self.table, self.queue, self._situation(), self.outbox)
        return self.outbox.take()
