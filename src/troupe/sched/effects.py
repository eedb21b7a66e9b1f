"""What the scheduler core asks its actor to do. Plain frozen data, no behaviour."""

from __future__ import annotations

import attrs

from troupe.sched.cpu import CpuPlan
from troupe.sched.devices import GpuPlan
from troupe.sched.events import SchedulerEvent
from troupe.sched.reasons import StopCause

__all__ = [
    "CancelMeasure",
    "DeleteFiles",
    "Effect",
    "Emit",
    "Failure",
    "Grant",
    "Measure",
    "Prefetch",
    "Reloaded",
    "Reply",
    "SampleMemory",
    "Spawn",
    "Stop",
]


@attrs.frozen
class Spawn:
    """Start a child for ``model``; ``gen`` tags every event that comes back from it."""

    model: str
    gen: int
    delay: float = 0.0  # LLAMA_SERVER_DEBUG_FAKE_TIMING waits before spawning
    cpu: CpuPlan | None = None  # its lane (None: not troupe's to place)
    gpu: GpuPlan | None = None  # its GPUs (None: not troupe's to place)


@attrs.frozen
class Stop:
    """Stop the child of ``model`` (generation ``gen``).

    ``kill``: SIGKILL at once (a model still loading); otherwise the ladder: exit command,
    ``stop-timeout``, SIGTERM, SIGKILL. ``save_slots``: its KV slots are saved first (the
    KV store), decided from the cause (`StopReason.saves_slots`); never for a kill.
    """

    model: str
    gen: int
    kill: bool
    cause: StopCause
    save_slots: bool


@attrs.frozen
class Grant:
    """A lease: the request may use the child at ``port`` until it releases ``lease``."""

    model: str
    port: int
    gen: int
    waited: bool  # the request had to wait for a load (detaches conversation requests)


@attrs.frozen
class Failure:
    """An answer that is an error, shaped like upstream's (status code, message, type)."""

    status: int
    message: str
    type: str
    retry_after: float | None = None  # seconds, for a Retry-After header
    # A tenant's limit (429): OpenAI's error code and the x-ratelimit-* headers.
    code: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()

    @classmethod
    def bad_request(cls, message: str) -> Failure:
        return cls(400, message, "invalid_request_error")

    @classmethod
    def not_found(cls, message: str) -> Failure:
        return cls(404, message, "not_found_error")

    @classmethod
    def server_error(cls, message: str) -> Failure:
        return cls(500, message, "server_error")

    @classmethod
    def unavailable(cls, message: str) -> Failure:
        return cls(503, message, "unavailable_error")


@attrs.frozen
class Reply:
    """Answer the asker ``to`` (a waiter, a load or unload call) with ``result``."""

    to: int
    result: Grant | Failure | None  # None: plain success ({"success": true})


@attrs.frozen
class Prefetch:
    """Start reading ``model``'s files into the page cache: it waits for a slot (a victim
    draining or exiting), and its child will load from memory instead of the disk."""

    model: str


@attrs.frozen
class SampleMemory:
    """Read every device's free memory and what each child process uses; answer with
    ``memory_sampled(sample, version)``."""

    pids: tuple[int, ...]
    version: int


@attrs.frozen
class Emit:
    """Tell the world (``/models/sse``, metrics, the model logs) what happened."""

    event: SchedulerEvent


@attrs.frozen
class Reloaded:
    """The catalog of reload ``rid`` is now the model table: swap it in before anything
    that follows (a Spawn reads the new command lines). ``rids``: every reload it answers
    (a reload asked for while one was under way is folded into it)."""

    rid: int
    rids: tuple[int, ...]


@attrs.frozen
class DeleteFiles:
    """Removal ``rid`` (``DELETE /models``): ``model``'s child is gone; delete its files,
    re-scan, and answer with a reload (as upstream)."""

    rid: int
    model: str


@attrs.frozen
class Measure:
    """Have the engine project what ``model`` takes under configuration ``fingerprint``;
    answer with ``measured`` or ``measure_failed``."""

    model: str
    fingerprint: str


@attrs.frozen
class CancelMeasure:
    """The projection running for ``model`` is no longer wanted (removed, changed)."""

    model: str


Effect = (
    Spawn
    | Stop
    | Reply
    | Emit
    | SampleMemory
    | Prefetch
    | Reloaded
    | DeleteFiles
    | Measure
    | CancelMeasure
)
