"""`SchedulerCore`: the model table and every decision about it, with no Trio and no I/O.

Each public method is one event (a request arrives, a child reports a state, time
passes); it updates the table and returns the effects for the actor to carry out.
The waiting rules follow llama.cpp's ``ensure_model_ready`` (spec §6.2-§6.4), but
a waiter is re-examined the moment something changes instead of every 200 ms.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from troupe.sched.effects import Effect, Emit, Failure, Grant, Reply, Spawn, Stop
from troupe.sched.lru import evictions_needed, pick_victim
from troupe.sched.queue import AdmissionQueue
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig, ModelState, ModelView, Snapshot

__all__ = ["SchedulerCore"]

FAKE_TIMING_DELAY = 2.0  # LLAMA_SERVER_DEBUG_FAKE_TIMING: seconds before each load
DEFAULT_LOAD_SECONDS = 10.0  # a load never measured yet, for Retry-After
EVICTION_REASONS = ("lru for ", "ttl", "memory")  # stops the scheduler decided on its own


@attrs.define
class _Waiter:
    model: str
    update_last_used: bool
    queued: bool = False
    did_load: bool = False  # this waiter's claim spawned the model
    saw_loading: bool = False


@attrs.define
class _Lease:
    model: str
    gen: int


@attrs.define
class _DirectLoad:
    """A ``POST /models/load`` waiting for the LRU victim it stopped to be gone."""

    model: str
    victim: str | None


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
    ) -> None:
        self.models_max = models_max
        self.queue_max = queue_max  # 0: no limit on waiting requests
        self.fake_timing = fake_timing
        self.crash_limit = crash_limit
        self.crash_window = crash_window
        self._models: dict[str, ModelState] = {c.name: ModelState(c) for c in models}
        self._queue = AdmissionQueue()
        self._waiters: dict[int, _Waiter] = {}
        self._leases: dict[int, _Lease] = {}
        self._direct: dict[int, _DirectLoad] = {}
        self._stop_all: list[int] = []
        self._closing = False
        self._reloading = False  # loads wait while the catalogue is swapped (§6.9)
        self._out: list[Effect] = []
        self._version = 0
        self._queue_seen: dict[str, tuple[int, int]] = {}  # model -> (waiters, position)

    # ----- requests -----------------------------------------------------------------

    def acquire(
        self,
        rid: int,
        model: str,
        now: float,
        *,
        autoload: bool = True,
        update_last_used: bool = True,
    ) -> list[Effect]:
        """A request wants to use ``model``; answered now or when the model is ready."""
        m = self._models.get(model)
        if self._closing:
            self._reply(rid, Failure.unavailable("server is shutting down"))
        elif m is None or m.removed:
            self._reply(rid, Failure.server_error(f"model name={model} is not found"))
        elif not autoload:
            # Upstream proxies to any running child without waiting, even one still loading
            # (which answers 503 itself); one not started yet has no port to proxy to.
            if m.status.is_running and m.spawn_pending:
                self._reply(rid, Failure.unavailable("Loading model"))
            elif m.status.is_running:
                self._grant(rid, m, update_last_used, now, waited=False)
            else:
                self._reply(rid, Failure.bad_request("model is not loaded"))
        elif not m.stopping and m.status.is_ready_or_sleeping:
            self._grant(rid, m, update_last_used, now, waited=False)
        elif self._held_back(m, now):
            self._reply(rid, Failure.unavailable(self._held_message(m, now)))
        elif self.queue_max > 0 and len(self._waiters) >= self.queue_max:
            self._reply(rid, self._queue_full(model))
        else:
            w = _Waiter(model, update_last_used)
            self._waiters[rid] = w
            if m.status is Status.UNLOADED:
                # The queue entry protects the model from eviction until its waiters leave.
                self._queue.join(model)
                w.queued = True
            self._settle(now)
        return self._flush()

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
        if m is None or m.removed:
            self._reply(rid, Failure.not_found("model is not found"))
        elif m.is_running:
            self._reply(rid, Failure.bad_request("model is already running"))
        elif m.status is not Status.UNLOADED:
            self._reply(rid, None)  # downloading/downloaded: upstream silently does nothing
        else:
            m.crashes.clear()  # an explicit load lifts a crash-loop hold
            m.held_until = None
            if self._reloading:
                self._direct[rid] = _DirectLoad(model, None)  # decided once the reload is done
            elif self._has_capacity():
                self._spawn(m, now, delay=0.0)
                self._reply(rid, None)
            else:
                victim = pick_victim(self._models, self._queue)
                if victim is None:
                    self._reply(rid, Failure.server_error("model limit reached, try again later"))
                else:
                    self._request_stop(self._models[victim], f"lru for {model}")
                    self._direct[rid] = _DirectLoad(model, victim)
            self._settle(now)
        return self._flush()

    def unload(self, rid: int, model: str, now: float) -> list[Effect]:
        """``POST /models/unload``: start the stop and answer without waiting (§3.4)."""
        m = self._models.get(model)
        if m is None or m.removed:
            self._reply(rid, Failure.bad_request("model is not found"))
        elif not m.status.is_running:
            self._reply(rid, Failure.bad_request("model is not running"))
        else:
            self._request_stop(m, "unload request")
            self._reply(rid, None)
            self._settle(now)
        return self._flush()

    def stop_all(self, rid: int, now: float) -> list[Effect]:
        """Shutdown: fail every waiter, stop every child, answer when none runs."""
        self._closing = True
        for wid, w in list(self._waiters.items()):
            if w.queued:
                self._queue.leave(w.model)
            del self._waiters[wid]
            self._reply(wid, Failure.unavailable("server is shutting down"))
        for did in list(self._direct):
            del self._direct[did]
            self._reply(did, Failure.unavailable("server is shutting down"))
        for m in self._models.values():
            self._request_stop(m, "shutdown")
        self._stop_all.append(rid)
        self._settle(now)
        return self._flush()

    def begin_reload(self, restart: Iterable[str], now: float) -> list[Effect]:
        """A reload starts: loads wait, and the running models in ``restart`` are stopped."""
        self._reloading = True
        for name in restart:
            m = self._models.get(name)
            if m is not None:
                self._request_stop(m, "preset changed")
        self._settle(now)
        return self._flush()

    def finish_reload(self, models: Iterable[ModelConfig], now: float) -> list[Effect]:
        """Swap in the new model list (§6.9 steps 4-8) and let loads go on."""
        fresh = {c.name: c for c in models}
        for name, m in list(self._models.items()):
            if name not in fresh:
                if m.is_running:
                    m.removed = True  # dropped once its child is gone
                    self._request_stop(m, "removed from the catalogue")
                else:
                    del self._models[name]
        for name, config in fresh.items():
            existing = self._models.get(name)
            if existing is None:
                self._models[name] = ModelState(config)
                continue
            m = existing
            m.config = config
            m.removed = False
            if not m.is_running:
                m.exit_code = 0  # a reload clears "failed"
                m.crashes.clear()
                m.held_until = None
        self._reloading = False
        self._emit("*", "models_reload")
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
            if isinstance(payload, dict) and payload:
                m.loaded_info = payload
                data["info"] = payload
            if m.load_started is not None:
                m.last_load_seconds = now - m.load_started
                m.load_started = None
            if m.in_flight == 0:
                m.idle_since = now
        elif state == "sleeping":
            m.status = Status.SLEEPING
            m.exit_code = 0
            data = {"status": "sleeping"}
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
    ) -> list[Effect]:
        """The child of generation ``gen`` is gone. ``code`` is upstream's (a signal is 1)."""
        m = self._current(model, gen)
        if m is None:
            return self._flush()
        was_running = m.status.is_running
        m.status = Status.UNLOADED
        m.exit_code = code
        m.stopping = False
        m.spawn_pending = False
        m.in_flight = 0  # leases on the dead child no longer count (see release)
        m.progress = None
        m.load_started = None
        if detail:
            m.last_error = detail
        if not expected:
            self._record_crash(m, now)
        if was_running:
            self._emit(model, "status_change", {"status": "unloaded", "exit_code": code})
        if m.removed:
            del self._models[model]
        self._settle(now)
        return self._flush()

    # ----- time -------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `on_time` next has something to do (a TTL expiry); None if never."""
        deadlines = [
            m.idle_since + m.config.ttl
            for m in self._models.values()
            if self._ttl_candidate(m) and m.config.ttl is not None
        ]
        return min(deadlines, default=None)

    def on_time(self, now: float) -> list[Effect]:
        for m in self._models.values():
            ttl = m.config.ttl
            if ttl is not None and self._ttl_candidate(m) and m.idle_since + ttl <= now:
                self._request_stop(m, "ttl")
        self._settle(now)
        return self._flush()

    # ----- reading ------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        waiting = {e.model: e.waiters for e in self._queue.entries}
        views = {
            name: ModelView(
                name=name,
                status=m.status,
                port=m.port,
                pid=m.pid,
                exit_code=m.exit_code,
                failed=m.failed,
                stopping=m.stopping,
                progress=m.progress,
                loaded_info=m.loaded_info,
                in_flight=m.in_flight,
                waiting=waiting.get(name, 0),
                queue_position=self._queue.position(name),
                last_used=m.last_used,
                last_load_seconds=m.last_load_seconds,
                last_eviction=m.last_eviction,
                last_error=m.last_error,
                held_until=m.held_until,
                pin=m.config.pin,
                ttl=m.config.ttl,
            )
            for name, m in sorted(self._models.items())
        }
        queue = tuple((e.model, e.waiters) for e in self._queue.entries)
        self._version += 1
        return Snapshot(
            version=self._version, models=views, models_max=self.models_max, queue=queue
        )

    def running_count(self) -> int:
        return sum(1 for m in self._models.values() if m.is_running)

    # ----- internals ----------------------------------------------------------------------

    def _flush(self) -> list[Effect]:
        self._emit_queue_changes()
        out, self._out = self._out, []
        return out

    def _emit_queue_changes(self) -> None:
        """A ``troupe_queue`` event for each entry whose waiters or position changed."""
        now_seen = {e.model: (e.waiters, i + 1) for i, e in enumerate(self._queue.entries)}
        for model in sorted(now_seen.keys() | self._queue_seen.keys()):
            state = now_seen.get(model)
            if state != self._queue_seen.get(model):
                waiters, position = state if state is not None else (0, None)
                self._emit(model, "troupe_queue", {"waiting": waiters, "position": position})
        self._queue_seen = now_seen

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
        self._leases[rid] = _Lease(m.config.name, m.gen)
        self._reply(rid, Grant(m.config.name, m.port, m.gen, waited))

    def _spawn(self, m: ModelState, now: float, delay: float) -> None:
        m.gen += 1
        m.spawn_pending = True
        m.exit_code = 0
        m.last_eviction = None
        m.port = m.pid = 0
        if delay <= 0:
            # Upstream's load() sets "loading" as it spawns: a GET /models or an unload
            # right after a successful POST /models/load must see a running model.
            self._mark_loading(m, now)
        self._out.append(Spawn(m.config.name, m.gen, delay))

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
        if reason.startswith(EVICTION_REASONS):
            self._emit(m.config.name, "troupe_evict", {"reason": reason})
        # A model still loading has no request to finish: it is killed at once.
        kill = m.status is Status.LOADING or m.spawn_pending
        self._out.append(Stop(m.config.name, m.gen, kill=kill, reason=reason))

    def _ttl_candidate(self, m: ModelState) -> bool:
        return (
            m.status.is_ready_or_sleeping
            and m.in_flight == 0
            and not m.stopping
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

    def _finish(self, rid: int, w: _Waiter, result: Failure) -> None:
        del self._waiters[rid]
        if w.queued:
            self._queue.leave(w.model)
        self._reply(rid, result)

    def _advance(self, rid: int, w: _Waiter, now: float) -> None:
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

    def _advance_direct(self, rid: int, d: _DirectLoad, now: float) -> None:
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
