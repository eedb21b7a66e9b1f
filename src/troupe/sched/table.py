"""The model table: per-model state the core owns (the frozen views it publishes are
`snapshot.py`'s)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from troupe.sched.cpu import CpuPlan, CpuRequest
from troupe.sched.devices import GpuPlan, GpuRequest
from troupe.sched.phase import RESTARTS, TRANSITIONS, IllegalTransition, Phase, Restart
from troupe.sched.reasons import StopCause, StopReason

__all__ = [
    "ModelConfig",
    "ModelState",
    "ModelTable",
    "RestartKey",
    "Tally",
]


@attrs.frozen
class RestartKey:
    """What a reload compares to tell whether a running model's child must start again
    (upstream's ``load_models``, reload branch): a digest of its preset as compared (host,
    port, alias, log colours and troupe's own keys left out), and whether that preset
    restarts it at every reload (a reserved option written into its section: upstream
    compares the running side without it and the fresh side with it)."""

    digest: str = ""
    always: bool = False

    def restarts(self, running: RestartKey) -> bool:
        """Whether a child started under ``running`` must start again under this key."""
        return self.always or self.digest != running.digest


@attrs.frozen
class ModelConfig:
    """What the catalog tells the scheduler about one model."""

    name: str
    pin: bool = False  # never evicted (still counts toward --models-max)
    ttl: float | None = None  # unload after this many idle seconds
    fingerprint: str = ""  # identity of its command line (memory observations are per it)
    need: Mapping[str, int] | None = None  # bytes per device to load it; None: unknown
    cpu: CpuRequest | None = None  # its own CPU flags (then troupe leaves its CPUs as given)
    gpu: GpuRequest | None = None  # its own device flags (then troupe leaves its GPUs as given)
    layers: int | None = None  # its layers as the engine counts offload (a partial offload)
    restart_key: RestartKey = RestartKey()  # a reload restarts it when this changes


class Tally:
    """How many models of a table are in each phase, and have each restart pending, kept
    by `ModelState.move`: a settle rule asks whether any is, cheaply."""

    def __init__(self) -> None:
        self.phases: dict[Phase, int] = dict.fromkeys(Phase, 0)
        self.restarts: dict[Restart, int] = dict.fromkeys(Restart, 0)

    def count(self, m: ModelState, step: int) -> None:
        self.phases[m.phase] += step
        if m.restart is not None:
            self.restarts[m.restart] += step


@attrs.define
class ModelState:
    """One model's lifecycle phase and the data that goes with it. Mutable, and only
    ever touched by the scheduler core; the phase (and a pending restart) changes only
    through `move`. The core decides on these; llama.cpp's `Status` is derived from them
    for readers (`troupe.sched.views.status_of`)."""

    config: ModelConfig
    phase: Phase = Phase.UNLOADED
    # What the current child last reported (or troupe announced for it: loading at a
    # spawn, or once a delayed spawn's process started), as the phase it puts the model
    # in: LOADING, LOADED or SLEEPING; None: nothing (no child, or a delayed spawn not
    # started yet). What the model shows, and is, while it drains or stops.
    reported: Phase | None = None
    gen: int = 0  # generation of the current (or last) child
    port: int = 0
    pid: int = 0
    exit_code: int = 0  # upstream's, of the last child (0 while one runs): non-zero failed
    # A Spawn was issued and its process has not started yet (STARTING; STOPPING when it
    # was told to stop before that: killed once it has).
    spawn_pending: bool = False
    # The spawn waits out LLAMA_SERVER_DEBUG_FAKE_TIMING until then (Trio time): it shows
    # unloaded and is not announced. None: no delay, or its process has started.
    delay_until: float | None = None
    # UNLOADED only: it is to start again at once (set and cleared through `move`).
    restart: Restart | None = None
    last_stop: StopCause | None = None  # why the current (or last) child was told to stop
    replanned: bool = False  # the current child was started again by a re-plan (CPU lane)
    drain_for: str | None = None  # draining for this model (kept while it then stops)
    drain_reason: StopReason = StopReason.DRAIN  # why: a swap, or a narrower CPU lane
    cpu: CpuPlan | None = None  # where troupe placed its current child (None: not placed)
    gpu: GpuPlan | None = None  # the GPUs troupe placed its current child on (None: not placed)
    held_until: float | None = None  # HELD: until when
    oom_retried: bool = False  # a load died of OOM and was retried since it last came up
    progress: dict[str, Any] | None = None
    loaded_info: dict[str, Any] | None = None
    last_used: float = 0.0
    demand: float = 0.0  # requests, each counted less as it ages (see sched.lru.demand)
    demand_at: float = 0.0  # when ``demand`` was last brought up to date
    idle_since: float = 0.0  # when the last request finished (TTL counts from here)
    in_flight: int = 0
    load_started: float | None = None
    last_load_seconds: float | None = None
    last_error: str | None = None
    crashes: deque[float] = attrs.field(factory=deque)
    # A request's keep_alive (the Ollama API) for child ``gen``: (gen, idle seconds),
    # inf for "keep it loaded". Only that child's: the next one starts with its config.
    keep_alive: tuple[int, float] | None = None
    # Its table's count of models per phase and restart (`ModelTable.in_phase`), kept by
    # `move`.
    tally: Tally | None = attrs.field(default=None, eq=False, repr=False)

    def move(self, phase: Phase, restart: Restart | None = None) -> None:
        """The one way a phase changes. ``restart``: the move (to UNLOADED, from a phase
        `RESTARTS` lists) leaves a restart pending; any move without it calls a pending
        one off. A move the lifecycle does not list raises."""
        old = self.phase
        if restart is not None and (phase is not Phase.UNLOADED or old not in RESTARTS[restart]):
            raise IllegalTransition(self.config.name, old, phase, restart)
        if phase is not old and phase not in TRANSITIONS[old]:
            raise IllegalTransition(self.config.name, old, phase)
        if phase is old and restart is self.restart:
            return
        tally = self.tally
        if tally is not None:
            tally.count(self, -1)
        self.phase = phase
        self.restart = restart
        if tally is not None:
            tally.count(self, +1)

    @property
    def name(self) -> str:
        return self.config.name

    def _kept_alive(self) -> float | None:
        if self.keep_alive is None or self.keep_alive[0] != self.gen or not self.is_running:
            return None
        return self.keep_alive[1]

    @property
    def pin(self) -> bool:
        """Never evicted nor unloaded on troupe's own initiative: its preset's ``pin``, or
        a request's ``keep_alive: -1`` for this child."""
        return self.config.pin or self._kept_alive() == math.inf

    @property
    def ttl(self) -> float | None:
        """Idle seconds before it unloads: a request's ``keep_alive`` for this child, else
        its preset's ``ttl`` (a preset ``pin`` beats any keep_alive: the operator's word)."""
        kept = None if self.config.pin else self._kept_alive()
        if kept is None:
            return self.config.ttl
        return None if kept == math.inf else kept

    # What the core decides on: the phase and the data beside it, and only where the
    # phase does not say what the current child is doing (it drains or stops) what that
    # child last reported.

    @property
    def delayed(self) -> bool:
        """A spawn waiting out fake timing (no process yet, not announced)."""
        return self.phase is Phase.STARTING and self.delay_until is not None

    @property
    def announced(self) -> bool:
        """A child runs and troupe has said it is loading (at the spawn; a delayed spawn
        once its process started): upstream counts the model as running."""
        return self.phase.is_running and self.reported is not None

    @property
    def child_loading(self) -> bool:
        """Its child is still loading the model (it has no request to finish)."""
        phase = self.phase
        if phase is Phase.LOADING:
            return True
        if phase is Phase.STARTING:
            return self.delay_until is None
        return phase in _HIDING and self.reported is Phase.LOADING

    @property
    def child_loaded(self) -> bool:
        """Its child has the model loaded and awake, and is not told to stop (it may drain)."""
        phase = self.phase
        return phase is Phase.LOADED or (phase is Phase.DRAINING and self.reported is Phase.LOADED)

    @property
    def asleep(self) -> bool:
        """Its child sleeps (its memory given back)."""
        phase = self.phase
        return phase is Phase.SLEEPING or (phase in _HIDING and self.reported is Phase.SLEEPING)

    @property
    def aborting(self) -> bool:
        """Told to stop before its process started: killed once it has."""
        return self.phase is Phase.STOPPING and self.spawn_pending

    @property
    def is_running(self) -> bool:
        return self.phase.is_running

    @property
    def stopping(self) -> bool:
        return self.phase.is_stopping

    @property
    def restarting(self) -> bool:
        """Its child is being started again on a narrower CPU lane (a re-plan): resident
        all along as far as llama.cpp's API is concerned, and no use of the model."""
        if self.restart is Restart.REPLAN:
            return True
        return self.replanned and self.phase in (Phase.STARTING, Phase.LOADING)

    @property
    def stopping_to_replan(self) -> bool:
        """Its child is being stopped to start again on a narrower CPU lane."""
        cause = self.last_stop
        return self.stopping and cause is not None and cause.reason is StopReason.REPLAN

    @property
    def replanning(self) -> bool:
        """Stopped to start again here on a narrower CPU lane, or on its way back: gone
        for a moment only (a request waits here for the new child, as on one node). A
        re-plan's drain is not counted: the requests it waits for may last long."""
        return self.restarting or self.stopping_to_replan

    @property
    def draining_for(self) -> str | None:
        """The model it makes room for, while it drains (or stops after draining)."""
        return self.drain_for

    @property
    def failed(self) -> bool:
        return not self.is_running and self.exit_code != 0


# Phases in which the current child's own state is what it last reported.
_HIDING = frozenset({Phase.DRAINING, Phase.STOPPING})


class ModelTable:
    """Every model the scheduler knows, by name; generations that never repeat."""

    def __init__(self, configs: Iterable[ModelConfig]) -> None:
        self.models: dict[str, ModelState] = {}
        # How many models are in each phase: a settle rule asks whether any is, cheaply.
        self._tally = Tally()
        for c in configs:
            self.add(c)
        # A model's generations never repeat, also across a removal and a re-add by a
        # reload: a stale lease or event from an old child must never match a new one.
        self._last_gen: dict[str, int] = {}
        # Names on their way out of the table (removed, or dropped by a reload): unknown
        # to requests from now on, kept until their child is gone.
        self._retiring: set[str] = set()

    def __iter__(self) -> Iterator[ModelState]:
        return iter(self.models.values())

    def __contains__(self, name: str) -> bool:
        return name in self.models

    def get(self, name: str) -> ModelState | None:
        return self.models.get(name)

    def known(self, name: str) -> ModelState | None:
        """``name``, unless it is unknown or retiring (a request for it fails)."""
        m = self.models.get(name)
        return m if m is not None and name not in self._retiring else None

    def current(self, name: str, gen: int) -> ModelState | None:
        """The model if ``gen`` is its current child; events from older children are stale."""
        m = self.models.get(name)
        return m if m is not None and m.gen == gen else None

    def add(self, config: ModelConfig) -> ModelState:
        self._forget(self.models.get(config.name))
        m = self.models[config.name] = ModelState(config, tally=self._tally)
        self._tally.count(m, +1)
        return m

    def drop(self, name: str) -> None:
        self._forget(self.models.pop(name, None))
        self._retiring.discard(name)

    def _forget(self, m: ModelState | None) -> None:
        if m is not None:
            self._tally.count(m, -1)
            m.tally = None

    def retire(self, name: str) -> None:
        self._retiring.add(name)

    def keep(self, name: str) -> None:
        """A retiring model is back in the catalog: it stays once its child is gone."""
        self._retiring.discard(name)

    def retiring(self, name: str) -> bool:
        return name in self._retiring

    def next_gen(self, m: ModelState) -> int:
        gen = max(m.gen, self._last_gen.get(m.name, 0)) + 1
        self._last_gen[m.name] = gen
        return gen

    # ----- reading ------------------------------------------------------------------------

    def running(self) -> list[ModelState]:
        return [m for m in self.models.values() if m.is_running]

    def running_count(self) -> int:
        return sum(1 for m in self.models.values() if m.is_running)

    def running_names(self) -> list[str]:
        return [m.name for m in self.models.values() if m.is_running]

    def in_phase(self, phase: Phase) -> bool:
        """Is any model in ``phase``?"""
        return self._tally.phases[phase] > 0

    def pending(self, restart: Restart) -> bool:
        """Has any model ``restart`` pending?"""
        return self._tally.restarts[restart] > 0

    def any_stopping(self) -> bool:
        return any(m.stopping for m in self.models.values())

    def memory_holders(self) -> dict[str, int]:
        """Models holding memory now (running and not asleep) -> pid (0: not started)."""
        return {name: m.pid for name, m in self.models.items() if m.is_running and not m.asleep}

    def pids(self) -> tuple[int, ...]:
        """The processes of the children running now, for a memory reading."""
        return tuple(sorted(m.pid for m in self.models.values() if m.pid and m.is_running))
