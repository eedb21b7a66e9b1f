"""What the scheduler tells the world about its models, as typed values.

The core emits these (inside an `Emit` effect); metrics and the model logs read
their fields; they become JSON only on the way out of the process, through
`to_json` (the ``/models/sse`` stream: upstream's shapes, ``{"model", "event",
"data"}``, plus troupe's own ``troupe_*`` events).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from troupe.sched.reasons import StopCause
from troupe.sched.status import Status

__all__ = [
    "CatalogReloaded",
    "ChildExited",
    "DownloadEnded",
    "DownloadProgressed",
    "DrainStarted",
    "MemoryProjected",
    "MemoryWarning",
    "ModelRemoved",
    "ModelStatusSet",
    "ProjectionFailed",
    "QueueChanged",
    "SchedulerEvent",
    "StatusChanged",
    "StopRequested",
]

Json = dict[str, Any]


def _wire(model: str, event: str, data: Json | None = None) -> Json:
    out: Json = {"model": model, "event": event}
    if data is not None:
        out["data"] = data
    return out


@attrs.frozen
class ModelStatusSet:
    """troupe set a status on its own (a spawn: loading; a download: downloading)."""

    model: str
    status: Status

    def to_json(self) -> Json:
        return _wire(self.model, "model_status", {"status": self.status.value})


@attrs.frozen
class StatusChanged:
    """A child reported a state, or its exit made the model unloaded."""

    model: str
    status: Status
    progress: Any = None  # loading: the child's payload, when it sent one
    info: Any = None  # loaded: the child's payload, when it is not empty
    exit_code: int | None = None  # unloaded: upstream's exit code

    def to_json(self) -> Json:
        data: Json = {"status": self.status.value}
        if self.progress is not None:
            data["progress"] = self.progress
        if self.info is not None:
            data["info"] = self.info
        if self.exit_code is not None:
            data["exit_code"] = self.exit_code
        return _wire(self.model, "status_change", data)


@attrs.frozen
class ChildExited:
    """A child is gone: whether troupe asked for it, and whether it ran out of memory."""

    model: str
    exit_code: int
    expected: bool
    oom: bool

    def to_json(self) -> Json:
        data = {"exit_code": self.exit_code, "expected": self.expected, "oom": self.oom}
        return _wire(self.model, "troupe_exit", data)


@attrs.frozen
class StopRequested:
    """The model's child is told to stop, and why. On the wire an eviction (a stop troupe
    decided on by itself) is ``troupe_evict``; any other stop ``troupe_stop``."""

    model: str
    cause: StopCause

    def to_json(self) -> Json:
        data = {"reason": self.cause.describe(), "kind": self.cause.reason.value}
        event = "troupe_evict" if self.cause.reason.is_eviction else "troupe_stop"
        return _wire(self.model, event, data)


@attrs.frozen
class DrainStarted:
    """The model takes no new request and goes once idle, for ``for_model``."""

    model: str
    for_model: str
    in_flight: int

    def to_json(self) -> Json:
        return _wire(
            self.model, "troupe_drain", {"for": self.for_model, "in_flight": self.in_flight}
        )


@attrs.frozen
class QueueChanged:
    """The model's queue entry changed: how many wait, where, and why."""

    model: str
    waiting: int
    position: int | None
    reason: str | None

    def to_json(self) -> Json:
        data = {"waiting": self.waiting, "position": self.position, "reason": self.reason}
        return _wire(self.model, "troupe_queue", data)


@attrs.frozen
class MemoryWarning:
    """The model loads without the memory check passing (and why)."""

    model: str
    warning: str

    def to_json(self) -> Json:
        return _wire(self.model, "troupe_memory", {"warning": self.warning})


@attrs.frozen
class MemoryProjected:
    """The engine projected what the model takes per device."""

    model: str
    need: Mapping[str, int]

    def to_json(self) -> Json:
        data = {"projected": dict(self.need), "source": "engine"}
        return _wire(self.model, "troupe_memory", data)


@attrs.frozen
class ProjectionFailed:
    """The engine could not project the model: the estimate stands."""

    model: str
    reason: str

    def to_json(self) -> Json:
        data = {"measure_failed": self.reason, "source": "estimate"}
        return _wire(self.model, "troupe_memory", data)


@attrs.frozen
class CatalogReloaded:
    """A reload's catalog is now the model table (about every model: ``*``)."""

    model: str = "*"

    def to_json(self) -> Json:
        return _wire(self.model, "models_reload")


@attrs.frozen
class ModelRemoved:
    """``DELETE /models``: the model's files are gone and the reload that followed is done."""

    model: str

    def to_json(self) -> Json:
        return _wire(self.model, "model_remove")


@attrs.frozen
class DownloadProgressed:
    model: str
    progress: Mapping[str, tuple[int, int]]  # url -> (done, total), cumulative

    def to_json(self) -> Json:
        cumulative = {url: {"done": d, "total": t} for url, (d, t) in self.progress.items()}
        return _wire(self.model, "download_progress", {"progress": cumulative})


@attrs.frozen
class DownloadEnded:
    """A download finished (``reason`` None) or failed (the hub's ``status`` if it refused;
    None when it was cancelled)."""

    model: str
    reason: str | None = None
    status: int | None = None

    def to_json(self) -> Json:
        if self.reason is None:
            return _wire(self.model, "download_finished")
        # Upstream sends no data; the reason (and the hub's status) is troupe's addition.
        data: Json = {"reason": self.reason}
        if self.status is not None:
            data["status"] = self.status
        return _wire(self.model, "download_failed", data)


SchedulerEvent = (
    ModelStatusSet
    | StatusChanged
    | ChildExited
    | StopRequested
    | DrainStarted
    | QueueChanged
    | MemoryWarning
    | MemoryProjected
    | ProjectionFailed
    | CatalogReloaded
    | ModelRemoved
    | DownloadProgressed
    | DownloadEnded
)
