"""`SchedulerCore`: the model table and every decision about it, with no Trio and no I/O.

Each public method is one event (a request arrives, a child reports a state, time
passes); it updates the table and returns the effects for the actor to carry out.
The core is a composition of small parts, each owning its own state:

- `ModelTable` (table.py): every model's lifecycle phase (phase.py) and data;
- `AdmissionQueue` (queue.py) and `Requests` (requests.py): who waits, who holds a lease;
- `Children` (children.py): the only place that spawns and stops; `CrashRecord`: holds;
- `ChildReports` (child_reports.py): what a child's news does to its model;
- `LoadGate` (gate.py): may a model load now (slots, `MemoryAdmission`, `Projections`);
- `DrainClock` (drain.py): fair admission's timer and swap count;
- `CatalogChanges` (reloads.py): reloads and removals under way; `Shutdown`;
- `Settler` (settle.py): after each event, the settle rules (rules/, in `RULES` order):
  who is answered, who loads, who goes, and why a request waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from troupe.sched.admission import MemoryAdmission
from troupe.sched.child_reports import ChildReports
from troupe.sched.children import Children, CrashRecord, lift_hold
from troupe.sched.cpu import CpuLedger
from troupe.sched.drain import DrainClock
from troupe.sched.effects import Effect, Failure
from troupe.sched.fair import Fair
from troupe.sched.lru import record_demand, ttl_expiry
from troupe.sched.measuring import MeasureQueue
from troupe.sched.memory import MemoryLedger, MemorySample
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase
from troupe.sched.placement import Placement
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.reloads import CatalogChanges
from troupe.sched.requests import DirectLoad, Requests, Waiter
from troupe.sched.settle import FAKE_TIMING_DELAY, Limits, Settler
from troupe.sched.shutdown import Shutdown, queue_full
from troupe.sched.snapshot import Snapshot
from troupe.sched.table import ModelConfig, ModelState, ModelTable
from troupe.sched.terms import DEFAULT_TERMS, TenantTerms
from troupe.sched.views import QueueReporter, model_views

__all__ = ["SchedulerCore"]


class SchedulerCore:
    """The single writer of the model table (ARCHITECTURE.md, principle 1)."""

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
        cpu: CpuLedger | None = None,
    ) -> None:
        self.limits = Limits(models_max, queue_max, fake_timing)
        self.table = ModelTable(models)
        self.queue = AdmissionQueue()
        self.requests = Requests()
        self.changes = CatalogChanges()
        self.outbox = Outbox()
        # A queued model that gets no slot because every loaded model is busy waits at
        # most ``drain_after`` before the busy one with the least demand is drained for
        # it (None: never, as upstream, whose rare models wait while popular ones stay busy).
        self.clock = DrainClock(drain_after)
        self.crashes = CrashRecord(crash_limit, crash_window)
        # Memory admission (None: count limit only), and the engine's own projections.
        self.memory = MemoryAdmission(memory) if memory is not None else None
        self.projections = (
            Projections(memory, self.outbox) if measure and memory is not None else None
        )
        # CPU placement (None: --cpu-placement off, children take the engine's defaults).
        self.cpu = cpu
        self.children = Children(self.table, self.outbox, self.clock, self.memory, cpu)
        self.placement = Placement(cpu, self.table, self.children, self.outbox, self.queue)
        # Slots, tenants' attained service and max_parallel (fair queuing, sched.fair).
        self.fair = Fair()
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
            self.projections,
            self.outbox,
            self.placement,
            self.fair,
        )
        self.reports = ChildReports(
            self.table,
            self.queue,
            self.requests,
            self.children,
            self.crashes,
            self.memory,
            self.projections,
            self.outbox,
        )
        self.shutdown = Shutdown(
            self.table, self.queue, self.requests, self.children, self.projections, self.outbox
        )
        self._reporter = QueueReporter()
        self._now = 0.0  # the time of the event being handled
        self._version = 0
        if memory is not None:
            for m in self.table:
                memory.set_estimate(m.name, m.config.need)
        if self.projections is not None:
            # Only what troupe could read itself: the engine cannot project a file whose
            # header is not a model's either (it would fail after starting a process).
            self.projections.add(sorted(m.name for m in self.table if m.config.need))

    @property
    def models_max(self) -> int:
        return self.limits.models_max

    @property
    def measure(self) -> MeasureQueue | None:
        """The engine's projections still to make and made (None: not asked for)."""
        return self.projections.queue if self.projections is not None else None

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
        terms: TenantTerms = DEFAULT_TERMS,
        slot: bool = False,
    ) -> list[Effect]:
        """A request wants to use ``model``; answered now or when the model is ready.
        ``ready_only``: answered now either way, with a lease only if it is loaded.
        ``terms``: whose request (sched.fair); ``slot``: it occupies one of the child's
        slots, so it waits (fair queuing) while they are all taken."""
        self._now = now
        m = self.table.known(model)
        out = self.outbox
        if self.requests.closed:
            out.reply(rid, Failure.unavailable("server is shutting down"))
        elif m is None:
            out.reply(rid, Failure.server_error(f"model name={model} is not found"))
        elif ready_only:
            if m.child_loaded:
                self.settler.grant(rid, m, update_last_used, now, waited=False)
            else:
                out.reply(rid, Failure.not_found(f"model name={model} is not loaded"))
        elif not autoload:
            # Upstream proxies to any running child without waiting, even one still loading
            # (which answers 503 itself); one not started yet has no port to proxy to.
            if (refused := self.not_loaded(model)) is not None:
                out.reply(rid, refused)
            elif m.spawn_pending:
                out.reply(rid, Failure.unavailable("Loading model"))
            else:
                self._grant_or_wait(rid, m, update_last_used, now, terms, slot, autoload=False)
        elif m.phase.serves:
            if update_last_used:
                record_demand(m, now, self.fair.demand_step(model, terms, now))
            self._grant_or_wait(rid, m, update_last_used, now, terms, slot, autoload=True)
        elif self.crashes.held_back(m, now):
            out.reply(rid, Failure.unavailable(self.crashes.message(m, now)))
        elif self.limits.queue_max > 0 and len(self.requests.waiters) >= self.limits.queue_max:
            out.reply(rid, queue_full(self.table, self.queue, self.requests, self.limits, model))
        else:
            if update_last_used:
                record_demand(m, now, self.fair.demand_step(model, terms, now))
            w = Waiter(model, update_last_used, since=now, terms=terms, slot=slot)
            self.requests.waiters[rid] = w
            if not m.announced:
                # The queue entry protects the model from eviction until its waiters leave.
                self.queue.join(model)
                w.queued = True
            self._settle(now)
        return self._flush()

    def _grant_or_wait(
        self,
        rid: int,
        m: ModelState,
        update_last_used: bool,
        now: float,
        terms: TenantTerms,
        slot: bool,
        *,
        autoload: bool,
    ) -> None:
        """A lease on a model that serves now, unless the request needs a slot and it is
        not its turn (all taken, others wait first, its max_parallel): then it waits."""
        if slot and m.phase.serves and not self.fair.free_now(m, terms, self.requests):
            w = Waiter(m.name, update_last_used, since=now, terms=terms, slot=True)
            w.slot_wait, w.autoload = True, autoload
            self.requests.waiters[rid] = w
            self._settle(now)
            return
        # A child still loading (a request that may not load, proxied as upstream does)
        # answers 503 itself at once: that takes none of its slots.
        slot = slot and m.phase.serves
        self.settler.grant(rid, m, update_last_used, now, waited=False, terms=terms, slot=slot)

    def not_loaded(self, model: str) -> Failure | None:
        """Upstream's refusal of a request that may not load ``model`` (``autoload``
        false): 400 "model is not loaded" unless it runs (loading, loaded, sleeping).
        `acquire` answers with it; a door that must refuse before it takes the client on
        (a WebSocket before its upgrade) asks here, changing nothing."""
        m = self.table.known(model)
        if m is None or not m.announced:
            return Failure.bad_request("model is not loaded")
        return None

    def grants_at_once(
        self,
        model: str,
        autoload: bool = True,
        ready_only: bool = False,
        terms: TenantTerms = DEFAULT_TERMS,
        slot: bool = False,
    ) -> bool:
        """Would `acquire` answer with a lease right away (and change nothing else)?"""
        m = self.table.known(model)
        if self.requests.closed or m is None:
            return False
        if ready_only:
            return m.child_loaded
        at_once = m.phase.serves if autoload else m.is_running and not m.spawn_pending
        if at_once and slot and m.phase.serves:
            return self.fair.free_now(m, terms, self.requests)
        return at_once

    def release(self, rid: int, now: float, tokens: int | None = None) -> list[Effect]:
        """A request is done with its lease, or gave up waiting (disconnect, timeout).
        ``tokens``: what its answer used, prompt + generated (None: unknown), its
        tenant's attained service (sched.fair)."""
        requests = self.requests
        lease = requests.leases.pop(rid, None)
        if lease is not None and lease.slot:
            self.fair.released(lease.model, lease.gen, lease.tenant, tokens, now)
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
        requests.until_gone.pop(rid, None)
        self._settle(now)
        return self._flush()

    def keep_alive(
        self,
        model: str,
        gen: int | None,
        seconds: float,
        now: float,
        *,
        rid: int | None = None,
        until_gone: bool = False,
    ) -> list[Effect]:
        """A request's ``keep_alive`` (the Ollama API) for child ``gen`` of ``model`` (None:
        whichever runs now): unloaded after ``seconds`` idle (0: as soon as its requests
        end), never on troupe's own initiative for inf. Through the TTL and the pin, so
        admission, memory and fairness see it like a preset's; the next child starts with
        its preset's again. A model that is not running is left alone.

        ``rid`` is answered once it is in effect; with ``until_gone`` (Ollama's
        ``keep_alive: 0`` with nothing to generate) once the child it makes go is gone, at
        once when it makes none go (nothing runs, or its preset pins it)."""
        self._now = now
        m = self.table.known(model)
        if m is not None and m.is_running and not m.stopping and gen in (None, m.gen):
            m.keep_alive = (m.gen, seconds)
        if rid is not None:
            goes = m is not None and m.is_running and m.ttl == 0 and not m.pin
            if until_gone and goes and m is not None and gen in (None, m.gen):
                self.requests.until_gone[rid] = (model, m.gen)
            else:
                self.outbox.reply(rid, None)
        self._settle(now)
        return self._flush()

    def load(self, rid: int, model: str, now: float) -> list[Effect]:
        """``POST /models/load``: evict the LRU model and wait for it, then spawn (as upstream)."""
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
            # LLAMA_SERVER_DEBUG_FAKE_TIMING: upstream sleeps 2 s first (see `next_deadline`).
            start = now + FAKE_TIMING_DELAY if self.limits.fake_timing else 0.0
            self.requests.direct[rid] = DirectLoad(model, None, not_before=start)
            self._settle(now)
        return self._flush()

    def unload(self, rid: int, model: str, now: float) -> list[Effect]:
        """``POST /models/unload``: start the stop and answer without waiting (as upstream)."""
        m = self.table.known(model)
        out = self.outbox
        if m is None:
            out.reply(rid, Failure.bad_request("model is not found"))
        elif not m.announced:
            if m.restart is not None:
                m.move(Phase.UNLOADED)  # the second start is called off; its waiters fail
                self._settle(now)
            out.reply(rid, Failure.bad_request("model is not running"))
        else:
            self.children.stop(m, StopCause(StopReason.UNLOAD), now)
            out.reply(rid, None)
            self._settle(now)
        return self._flush()

    # ----- child events ---------------------------------------------------------------

    def spawned(
        self, model: str, gen: int, port: int, pid: int, now: float, *, slots: int | None = None
    ) -> list[Effect]:
        """Child ``gen`` started; ``slots``: the requests it serves at once (its
        ``--parallel``; None: llama-server's default, `sched.fair.DEFAULT_SLOTS`)."""
        if slots is not None and self.table.current(model, gen) is not None:
            self.fair.learn_slots(model, gen, slots)
        if self.reports.spawned(model, gen, port, pid, now):
            self._settle(now)
        return self._flush()

    def child_state(
        self, model: str, gen: int, state: str, payload: Any, now: float
    ) -> list[Effect]:
        """A ``cmd_child_to_router:state:`` line; an unknown state is ignored."""
        if self.reports.state(model, gen, state, payload, now):
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
        oom_device: str | None = None,
    ) -> list[Effect]:
        """The child of generation ``gen`` is gone. ``code`` is upstream's (a signal is 1);
        ``oom``: its log said it ran out of memory (on ``oom_device``, when it said where)."""
        self._now = now
        if self.reports.exited(
            model, gen, code, now, expected=expected, detail=detail, oom=oom, oom_device=oom_device
        ):
            self._settle(now)
        return self._flush()

    # ----- the table as a whole: shutdown, reload, removal ------------------------------------

    def stop_all(self, rid: int, now: float) -> list[Effect]:
        """Shutdown: fail every waiter, stop every child, answer when none runs."""
        self.shutdown.stop_all(rid, now)
        self._settle(now)
        return self._flush()

    def begin_shutdown(self, now: float) -> list[Effect]:
        """Shutdown begins: requests holding a lease finish, nothing else starts (see
        `Shutdown.begin`); loaded children stay up until `stop_all`."""
        self.shutdown.begin(now)
        self._settle(now)
        return self._flush()

    def reload(self, rid: int, models: Iterable[ModelConfig], now: float) -> list[Effect]:
        """A reload (as upstream's): loads wait, the running models that ``models`` drops or whose
        `RestartKey` changed are stopped, and once none of them runs ``models`` becomes the
        table and ``rid`` is answered. A reload asked for meanwhile is folded in: its
        catalog, read later, wins, and both are answered together."""
        models = tuple(models)
        fresh = {c.name: c for c in models}
        restart = [
            m
            for m in self.table
            if m.is_running
            and ((c := fresh.get(m.name)) is None or c.restart_key.restarts(m.config.restart_key))
        ]
        self.changes.fold(rid, (m.name for m in restart), models)
        for m in sorted(restart, key=lambda m: m.name):
            self.children.stop(m, StopCause(StopReason.RELOAD), now)
        self._settle(now)
        return self._flush()

    def remove(self, rid: int, model: str, now: float) -> list[Effect]:
        """``DELETE /models``, as upstream: stop ``model``, then have its files deleted. From now on
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
        if self.projections is not None:
            m = self.table.get(model)
            config = m.config if m is not None else None
            self.projections.measured(config, model, fingerprint, need, high)
        self._settle(now)
        return self._flush()

    def measure_failed(self, model: str, fingerprint: str, reason: str, now: float) -> list[Effect]:
        """The engine could not project ``model``: the estimate stands (upstream settles a
        failed measurement: the load goes on), and it is measured again after a load."""
        if self.projections is not None:
            self.projections.failed(model, fingerprint, reason)
        self._settle(now)
        return self._flush()

    # ----- time -------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `on_time` next has something to do (a TTL expiry, a drain, a load waiting
        out fake timing, a measurement that never answered); None if never."""
        deadlines = [d for m in self.table if (d := ttl_expiry(m, self.queue)) is not None]
        drain = self.clock.deadline()
        if drain is not None:
            deadlines.append(drain)
        if self.memory is not None and (due := self.memory.deadline()) is not None:
            deadlines.append(due)
        if (widen := self.placement.widen_deadline(self._now)) is not None:
            deadlines.append(widen)
        if self.projections is not None and (answer := self.projections.deadline()) is not None:
            deadlines.append(answer)
        # (one already due, but after an event that did not settle: at once)
        deadlines += [d.not_before for d in self.requests.direct.values() if d.not_before]
        return min(deadlines, default=None)

    def start(self, now: float) -> list[Effect]:
        """The scheduler is up: what waits for no request starts now (the engine's memory
        projections, so a model's first load need not wait for its own)."""
        self._settle(now)
        return self._flush()

    def on_time(self, now: float) -> list[Effect]:
        self._now = now
        for m in list(self.table):
            expiry = ttl_expiry(m, self.queue)
            if expiry is not None and expiry <= now:
                # A client's keep_alive for this child, else the preset's ttl (ModelState.ttl).
                asked = m.keep_alive is not None and m.keep_alive[0] == m.gen and not m.config.pin
                reason = StopReason.KEEP_ALIVE if asked else StopReason.TTL
                self.children.stop(m, StopCause(reason), now)
        if self.clock.due(now):
            self.settler.start_drain(now)
        self.placement.widen(now)
        if self.projections is not None:
            self.projections.expire(now)
        if self.memory is not None and self.memory.true_up_due(now):
            self.children.ask_memory()
        self._settle(now)
        return self._flush()

    # ----- views ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        self._version += 1
        return Snapshot(
            version=self._version,
            models=model_views(
                self.table,
                self.queue,
                self.memory,
                self.projections,
                {m.name: self.fair.slots_of(m) for m in self.table},
            ),
            models_max=self.limits.models_max,
            queue=tuple((e.model, e.waiters) for e in self.queue.entries),
            devices=self.memory.sample.devices if self.memory and self.memory.sample else (),
            recent_swaps=self.clock.recent_swaps(self._now),
        )

    def _settle(self, now: float) -> None:
        self._now = now
        self.settler.settle(now)

    def _flush(self) -> list[Effect]:
        self._reporter.report(self.queue, self.outbox)
        return self.outbox.take()
