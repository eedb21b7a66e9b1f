"""The scheduler core's state and the small operations every event handler shares.

`SchedulerCore` (core.py) is built in three layers, one module each: this state, the
settling rules (settle.py: who waits, who loads, who is evicted), and the events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

import attrs

from troupe.sched.effects import (
    CancelMeasure,
    Effect,
    Emit,
    Failure,
    Grant,
    Measure,
    Reply,
    SampleMemory,
    Spawn,
    Stop,
)
from troupe.sched.measuring import MeasureQueue
from troupe.sched.memory import MemoryLedger, MemorySample
from troupe.sched.queue import AdmissionQueue
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig, ModelState

__all__ = ["CoreBase", "DirectLoad", "Lease", "PendingReload", "Waiter"]

FAKE_TIMING_DELAY = 2.0  # LLAMA_SERVER_DEBUG_FAKE_TIMING: seconds before each load
DEFAULT_LOAD_SECONDS = 10.0  # a load never measured yet, for Retry-After
EVICTION_REASONS = ("lru for ", "ttl", "memory", "drain for ")  # stops decided by the scheduler
SWAP_REASONS = ("lru for ", "memory for ", "drain for ")  # a model stopped to make room for another
SWAP_WINDOW = 60.0  # seconds: swaps_per_minute
TRUE_UP_DELAY = 0.5  # seconds after a child is ready before it is read (unless sooner)


@attrs.define
class Waiter:
    model: str
    update_last_used: bool
    queued: bool = False
    did_load: bool = False  # this waiter's claim spawned the model
    saw_loading: bool = False


@attrs.define
class Lease:
    model: str
    gen: int


@attrs.define
class DirectLoad:
    """A ``POST /models/load`` waiting for the LRU victim it stopped to be gone."""

    model: str
    victim: str | None
    victim_gen: int = 0  # the victim's child we wait for; a newer one is not ours to wait on


@attrs.define
class PendingReload:
    """A reload under way: loads wait until every model in ``restart`` is gone."""

    rid: int  # the latest reload: its catalogue wins
    rids: list[int]
    restart: set[str]
    models: tuple[ModelConfig, ...]


class CoreBase:
    """State of the scheduler core; mutated only by its own event methods."""

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
        self.models_max = models_max
        # A queued model that gets no slot because every loaded model is busy waits at
        # most this long before the busy one with the least demand is drained for it
        # (None: never, as upstream, whose rare models wait while popular ones stay busy).
        self.drain_after = drain_after
        self._starved_since: float | None = None
        self._drain_futile = False  # a drain found no victim: none until a lease is taken
        self._swaps: deque[float] = deque()
        self._now = 0.0  # the time of the event being handled
        self.queue_max = queue_max  # 0: no limit on waiting requests
        self.fake_timing = fake_timing
        self.crash_limit = crash_limit
        self.crash_window = crash_window
        self._models: dict[str, ModelState] = {c.name: ModelState(c) for c in models}
        self._queue = AdmissionQueue()
        self._waiters: dict[int, Waiter] = {}
        self._leases: dict[int, Lease] = {}
        self._direct: dict[int, DirectLoad] = {}
        self._stop_all: list[int] = []
        self._closing = False  # shutting down: no new lease, no new load
        self._reload: PendingReload | None = None  # loads wait meanwhile (§6.9)
        self._removals: dict[int, str] = {}  # DELETE /models waiting for the child to go
        # A model's generations never repeat, also across a removal and a re-add by a
        # reload: a stale lease or event from an old child must never match a new one.
        self._last_gen: dict[str, int] = {}
        self._out: list[Effect] = []
        self._prefetched: set[str] = set()  # models waiting for a slot, files read ahead
        self._version = 0
        self._queue_seen: dict[str, tuple[int, int, str]] = {}  # model -> (waiters, position, why)
        # Memory admission (None: count limit only). A sample is "fresh" while nothing
        # that changes memory use (a spawn, a ready, an exit) happened since it was asked.
        self.memory = memory
        if memory is not None:
            for m in self._models.values():
                memory.set_estimate(m.config.name, m.config.need)
        self._sample: MemorySample | None = None
        self._mem_version = 0
        self._grown_version = 0  # the last change that may have taken memory (not an exit)
        self._sampled_version = -1
        # A child that came up is read again a moment later, not at once: its first
        # requests run then, and a reading competes with them for the CPU.
        self._true_up_due: float | None = None
        self._true_up_version = 0  # a reading of this version or later does it
        self._sampling = False
        self._sample_failed_version = -1  # a reading of this version could not be made
        # The engine's own projections (measure jobs), with memory admission only.
        self._measure = MeasureQueue() if measure and memory is not None else None
        if self._measure is not None:
            # Only what troupe could read itself: the engine cannot project a file whose
            # header is not a model's either (it would fail after starting a process).
            self._measure.add(sorted(n for n, m in self._models.items() if m.config.need))

    # ----- reading ------------------------------------------------------------------------

    def running_names(self) -> list[str]:
        return [name for name, m in self._models.items() if m.is_running]

    def running_count(self) -> int:
        return sum(1 for m in self._models.values() if m.is_running)

    # ----- internals ----------------------------------------------------------------------

    def _measure_next(self) -> None:
        """Start the next measurement, if none runs (one engine process at a time)."""
        if self._measure is None or self._closing:
            return
        fingerprints = {n: m.config.fingerprint for n, m in self._models.items()}
        self._measure.todo = [n for n in self._measure.todo if n in fingerprints]
        wanted = [d.model for d in self._direct.values()] + [e.model for e in self._queue.entries]
        for name in reversed(wanted):  # models requests wait for first, in their order
            self._measure.bump(name)
        job = self._measure.start(fingerprints)
        if job is not None:
            self._out.append(Measure(*job))

    def _forget_measurement(self, name: str) -> None:
        if self._measure is not None and self._measure.forget(name):
            self._out.append(CancelMeasure(name))

    def _queue_full(self, model: str) -> Failure:
        """503 with a Retry-After from the measured load times of the models ahead."""
        ahead = [e.model for e in self._queue.entries]
        if model not in ahead:
            ahead.append(model)
        seconds = 0.0
        for name in ahead:
            m = self._models.get(name)
            load = m.last_load_seconds if m is not None else None
            seconds += load if load is not None else DEFAULT_LOAD_SECONDS
        message = (
            f"too many requests waiting for models ({len(self._waiters)}, --queue-max "
            f"{self.queue_max}); retry in {max(1, round(seconds))} s"
        )
        return Failure(503, message, "unavailable_error", retry_after=max(1.0, seconds))

    def _reply(self, rid: int, result: Grant | Failure | None) -> None:
        self._out.append(Reply(rid, result))

    def _emit(self, model: str, event: str, data: dict[str, Any] | None = None) -> None:
        self._out.append(Emit(model, event, data))

    def _current(self, model: str, gen: int) -> ModelState | None:
        """The model if ``gen`` is its current child; events from older children are stale."""
        m = self._models.get(model)
        return m if m is not None and m.gen == gen else None

    def _has_capacity(self) -> bool:
        # A pending spawn counts: two claims must never share one slot.
        return self.models_max <= 0 or self.running_count() < self.models_max

    def _grant(
        self, rid: int, m: ModelState, update_last_used: bool, now: float, *, waited: bool
    ) -> None:
        if update_last_used:
            m.last_used = now
        m.in_flight += 1
        self._drain_futile = False  # a model newly busy may be one a drain can take
        self._leases[rid] = Lease(m.config.name, m.gen)
        self._reply(rid, Grant(m.config.name, m.port, m.gen, waited))

    @property
    def _reloading(self) -> bool:
        return self._reload is not None

    def _spawn(self, m: ModelState, now: float, delay: float) -> None:
        m.gen = max(m.gen, self._last_gen.get(m.config.name, 0)) + 1
        self._last_gen[m.config.name] = m.gen
        m.respawn_after_evictions = False  # whatever started it, an OOM retry is now moot
        m.spawn_pending = True
        m.exit_code = 0
        m.last_eviction = None
        m.draining_for = None
        m.port = m.pid = 0
        if delay <= 0:
            # Upstream's load() sets "loading" as it spawns: a GET /models or an unload
            # right after a successful POST /models/load must see a running model.
            self._mark_loading(m, now)
        self._out.append(Spawn(m.config.name, m.gen, delay))

    def _memory_changed(self, *, released: bool = False) -> None:
        """``released``: a child exited or went to sleep, so memory can only have come back."""
        self._mem_version += 1
        if not released:
            self._grown_version = self._mem_version

    def _sample_fresh(self) -> bool:
        return self._sample is not None and self._sampled_version == self._mem_version

    def _sample_conservative(self) -> bool:
        """Only releases since the last reading: it understates what is free, so a model
        it admits fits (a swap need not wait for a new reading after its victim exits)."""
        return self._sample is not None and self._grown_version <= self._sampled_version

    def _request_sample(self) -> None:
        if self.memory is None or self._sampling:
            return
        self._sampling = True
        pids = tuple(sorted(m.pid for m in self._models.values() if m.pid and m.is_running))
        self._out.append(SampleMemory(pids, self._mem_version))

    def _memory_holders(self) -> dict[str, int]:
        """Models holding memory now (running and not asleep) -> pid (0: not started)."""
        return {
            name: m.pid
            for name, m in self._models.items()
            if m.is_running and m.status is not Status.SLEEPING
        }

    def _mark_loading(self, m: ModelState, now: float) -> None:
        m.status = Status.LOADING
        m.loaded_info = None
        m.progress = None
        m.last_used = now
        m.load_started = now
        self._emit(m.config.name, "model_status", {"status": "loading"})

    def _request_stop(self, m: ModelState, reason: str) -> None:
        """Idempotent: a model already stopping is left alone (§6.5)."""
        if m.stopping or not m.is_running:
            return
        m.stopping = True
        m.last_eviction = reason
        if reason.startswith(SWAP_REASONS):
            self._swaps.append(self._now)
            if self.memory is not None and not self._sample_fresh():
                # Read while the victim exits: the model it makes room for is admitted on
                # this reading the moment the victim is gone (see _sample_conservative).
                self._request_sample()
        if reason.startswith(EVICTION_REASONS):
            self._emit(m.config.name, "troupe_evict", {"reason": reason})
        # A model still loading has no request to finish: it is killed at once.
        kill = m.status is Status.LOADING or m.spawn_pending
        self._out.append(Stop(m.config.name, m.gen, kill=kill, reason=reason))

    def _ttl_candidate(self, m: ModelState) -> bool:
        return (
            m.status.is_ready_or_sleeping
            and not m.config.pin  # pinned means never unloaded on troupe's own initiative
            and m.in_flight == 0
            and not m.stopping
            and m.draining_for is None
            and self._queue.find(m.config.name) is None
        )

    def _record_crash(self, m: ModelState, now: float) -> None:
        m.crashes.append(now)
        while m.crashes and m.crashes[0] <= now - self.crash_window:
            m.crashes.popleft()
        if self.crash_limit > 0 and len(m.crashes) >= self.crash_limit:
            m.held_until = m.crashes[-self.crash_limit] + self.crash_window

    def _held_back(self, m: ModelState, now: float) -> bool:
        if m.held_until is None:
            return False
        if now >= m.held_until:
            m.held_until = None
            return False
        return m.status is Status.UNLOADED

    def _held_message(self, m: ModelState, now: float) -> str:
        assert m.held_until is not None
        left = max(1, round(m.held_until - now))
        return (
            f"model name={m.config.name} crashed {len(m.crashes)} times in "
            f"{self.crash_window:g} s and is held back for {left} s more "
            "(POST /models/load retries it now)"
            + (f"; last error: {m.last_error}" if m.last_error else "")
        )
