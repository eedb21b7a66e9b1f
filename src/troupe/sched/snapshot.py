"""What the core publishes of the model table: `ModelView` (one model as readers see
it) and `Snapshot` (the whole table at one instant, immutable), built by
`views.model_views` and `SchedulerCore.snapshot`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from troupe.sched.cpu import CpuPlan, CpuRequest
from troupe.sched.devices import GpuPlan, GpuRequest
from troupe.sched.downloads import DownloadView
from troupe.sched.memory import DeviceMemory
from troupe.sched.phase import Phase
from troupe.sched.reasons import StopCause
from troupe.sched.status import Status

__all__ = ["ModelView", "Snapshot"]


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
    last_stop: StopCause | None  # why its current (or last) child was told to stop
    last_error: str | None
    held_until: float | None
    pin: bool
    ttl: float | None
    phase: Phase = Phase.UNLOADED
    # The lifecycle word ``/models`` shows (``troupe.phase``): the phase, or what the data
    # beside it says (failed, retrying, replanning, delayed, aborting); `views.shown_phase`.
    shown_phase: str = "unloaded"
    wait_reason: str | None = None  # why its queued requests wait (None: nobody waits)
    draining_for: str | None = None  # it is being swapped out for this model
    memory_need: Mapping[str, int] | None = None  # what loading it takes, before it loads
    memory_used: Mapping[str, int] | None = None  # what it was seen to hold once up
    memory_reserved: Mapping[str, int] | None = None  # what admission counts: used, else need
    memory_source: str | None = None  # where memory_need comes from: "engine" or "estimate"
    memory_high: Mapping[str, int] | None = None  # the engine's figure at full context
    cpu: CpuPlan | None = None  # where troupe placed its child (cores, threads)
    cpu_request: CpuRequest | None = None  # or what its own flags say
    gpu: GpuPlan | None = None  # the GPUs troupe placed its child on
    gpu_request: GpuRequest | None = None  # or what its own device flags say
    idle_since: float = 0.0  # when its last request finished (Trio time; TTL counts from here)
    restarting: bool = False  # started again on a narrower CPU lane (ModelState.restarting)
    replanning: bool = False  # or stopped for it: back in a moment (ModelState.replanning)
    slots: int | None = None  # requests its child serves at once (its --parallel)

    @property
    def api_status(self) -> Status:
        """llama.cpp's status as its API shows it: a model whose child is started again
        on a narrower CPU lane stays ``loaded`` (upstream has no such restart; a request
        for it meanwhile waits for the new child, as for a busy one)."""
        return Status.LOADED if self.restarting else self.status

    @property
    def last_eviction(self) -> str | None:
        """``last_stop`` in words (``lru for b``), as ``/models`` shows it."""
        return self.last_stop.describe() if self.last_stop is not None else None


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
