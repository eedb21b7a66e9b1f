"""The model table: per-model state the core owns, and the frozen views it publishes."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import attrs

from troupe.sched.downloads import DownloadView
from troupe.sched.memory import DeviceMemory
from troupe.sched.status import Status

__all__ = ["ModelConfig", "ModelState", "ModelView", "Snapshot"]


@attrs.frozen
class ModelConfig:
    """What the catalogue tells the scheduler about one model."""

    name: str
    pin: bool = False  # never evicted (still counts toward --models-max)
    ttl: float | None = None  # unload after this many idle seconds
    fingerprint: str = ""  # identity of its command line (memory observations are per it)
    need: Mapping[str, int] | None = None  # bytes per device to load it; None: unknown


@attrs.define
class ModelState:
    """Mutable, and only ever touched by `SchedulerCore`."""

    config: ModelConfig
    status: Status = Status.UNLOADED
    gen: int = 0  # generation of the current (or last) child
    port: int = 0
    pid: int = 0
    exit_code: int = 0
    stopping: bool = False
    spawn_pending: bool = False  # a Spawn was issued, the child is not started yet
    progress: dict[str, Any] | None = None
    loaded_info: dict[str, Any] | None = None
    last_used: float = 0.0
    demand: float = 0.0  # requests, each counted less as it ages (see sched.lru.demand)
    demand_at: float = 0.0  # when ``demand`` was last brought up to date
    idle_since: float = 0.0  # when the last request finished (TTL counts from here)
    in_flight: int = 0
    load_started: float | None = None
    last_load_seconds: float | None = None
    last_eviction: str | None = None
    last_error: str | None = None
    crashes: deque[float] = attrs.field(factory=deque)
    held_until: float | None = None
    removed: bool = False  # dropped from the catalogue, kept until its child is gone
    draining_for: str | None = None  # takes no new lease; stopped once idle, for this model
    oom_retried: bool = False  # an out-of-memory load was already retried once
    respawn_after_evictions: bool = False  # retry that load once the evictions are done

    @property
    def failed(self) -> bool:
        return self.status is Status.UNLOADED and self.exit_code != 0

    @property
    def is_running(self) -> bool:
        return self.status.is_running or self.spawn_pending


@attrs.frozen
class ModelView:
    """One model as readers see it (``GET /models``, the dashboard)."""

    name: str
    status: Status
    port: int
    pid: int
    exit_code: int
    failed: bool
    stopping: bool
    progress: dict[str, Any] | None
    loaded_info: dict[str, Any] | None
    in_flight: int
    waiting: int  # requests queued for this model
    queue_position: int | None  # 1-based position of its queue entry
    last_used: float
    last_load_seconds: float | None
    last_eviction: str | None
    last_error: str | None
    held_until: float | None
    pin: bool
    ttl: float | None
    wait_reason: str | None = None  # why its queued requests wait (None: nobody waits)
    draining_for: str | None = None  # it is being swapped out for this model
    memory_need: Mapping[str, int] | None = None  # what loading it takes, before it loads
    memory_used: Mapping[str, int] | None = None  # what it was seen to hold once up
    memory_reserved: Mapping[str, int] | None = None  # what admission counts: used, else need
    memory_source: str | None = None  # where memory_need comes from: "engine" or "estimate"
    memory_high: Mapping[str, int] | None = None  # the engine's figure at full context


@attrs.frozen
class Snapshot:
    """The whole table at one instant; immutable, so readers never see a half-update."""

    version: int
    models: dict[str, ModelView]
    models_max: int
    queue: tuple[tuple[str, int], ...]  # (model, waiters) in queue order
    devices: tuple[DeviceMemory, ...] = ()  # the last memory reading, if any
    recent_swaps: tuple[float, ...] = ()  # when a model was stopped for another, last minute
    downloads: Mapping[str, DownloadView] = attrs.field(factory=dict)  # by requested name

    def swaps_since(self, since: float) -> int:
        """Swaps (a model stopped to make room for another) after ``since`` (Trio time)."""
        return sum(1 for t in self.recent_swaps if t > since)

    @property
    def running(self) -> int:
        return sum(1 for m in self.models.values() if m.status.is_running)
