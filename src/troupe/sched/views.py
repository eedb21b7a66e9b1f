"""What the scheduler core shows of itself: the snapshot readers get, and the
``troupe_queue`` SSE events. llama.cpp's `Status` of a model, and the lifecycle word
``/models`` shows, are computed here alone (`status_of`, `shown_phase`) from the phase and
the data beside it; the core decides on those, never on a `Status`. Why a request waits
is not derived here: the settle rule that decided it recorded the reason on the queue
entry (`QueueEntry.reason`)."""

from __future__ import annotations

from collections.abc import Mapping

from troupe.sched.admission import MemoryAdmission
from troupe.sched.events import QueueChanged
from troupe.sched.memory import PerDevice
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase, Restart
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.snapshot import ModelView
from troupe.sched.status import Status
from troupe.sched.table import ModelState, ModelTable

__all__ = ["QueueReporter", "model_views", "shown_phase", "status_of"]

# llama.cpp's status of a model whose phase says it; while it drains or stops, what its
# child last reported (upstream keeps showing a stopping child as it was until it exits).
_SHOWN = {
    Phase.UNLOADED: Status.UNLOADED,
    Phase.HELD: Status.UNLOADED,
    Phase.LOADING: Status.LOADING,
    Phase.LOADED: Status.LOADED,
    Phase.SLEEPING: Status.SLEEPING,
}


def status_of(m: ModelState) -> Status:
    """llama.cpp's status of ``m``, as readers see it. A spawn shows loading (upstream's
    load() says so as it spawns) unless it waits out fake timing."""
    phase = m.phase
    shown = _SHOWN.get(phase)
    if shown is not None:
        return shown
    if phase is Phase.STARTING:
        return Status.UNLOADED if m.delayed else Status.LOADING
    reported = m.reported  # it drains or stops
    return _SHOWN[reported] if reported is not None else Status.UNLOADED


_RESTARTING = {Restart.OOM: "retrying", Restart.REPLAN: "replanning"}
_WORD: dict[Phase, str] = {p: p.value for p in Phase}


def shown_phase(m: ModelState) -> str:
    """The lifecycle word ``/models`` shows for ``m`` (``troupe.phase``): its phase, or
    where the data beside it names a state of its own, that name."""
    phase = m.phase
    if phase is Phase.UNLOADED:
        if m.restart is not None:
            return _RESTARTING[m.restart]
        return "failed" if m.exit_code != 0 else "unloaded"
    if phase is Phase.STARTING and m.delayed:
        return "delayed"
    if m.aborting:
        return "aborting"
    return _WORD[phase]


class QueueReporter:
    """A ``troupe_queue`` event for each entry whose waiters, position or reason for
    waiting changed since the last report."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, int, str]] = {}

    def report(self, queue: AdmissionQueue, out: Outbox) -> None:
        if not queue.entries and not self._seen:
            return  # nobody waits, nor did: nothing to say (a release on a loaded model)
        seen = {e.model: (e.waiters, i + 1, e.reason) for i, e in enumerate(queue.entries)}
        for model in sorted(seen.keys() | self._seen.keys()):
            state = seen.get(model)
            if state != self._seen.get(model):
                waiting, position, reason = state if state is not None else (0, None, None)
                out.emit(QueueChanged(model, waiting, position, reason))
        self._seen = seen


def model_views(
    table: ModelTable,
    queue: AdmissionQueue,
    memory: MemoryAdmission | None,
    projections: Projections | None,
    slots: Mapping[str, int] | None = None,
) -> dict[str, ModelView]:
    waiting = {e.model: e.waiters for e in queue.entries}
    reasons = {e.model: e.reason for e in queue.entries}
    ledger = memory.ledger if memory is not None else None
    return {
        name: ModelView(
            name=name,
            status=status_of(m),
            port=m.port,
            pid=m.pid,
            exit_code=m.exit_code,
            failed=m.failed,
            stopping=m.stopping,
            progress=m.progress,
            loaded_info=m.loaded_info,
            in_flight=m.in_flight,
            waiting=waiting.get(name, 0),
            queue_position=queue.position(name),
            last_used=m.last_used,
            last_load_seconds=m.last_load_seconds,
            last_stop=m.last_stop,
            last_error=m.last_error,
            held_until=m.held_until,
            pin=m.pin,
            ttl=m.ttl,
            idle_since=m.idle_since,
            restarting=m.restarting,
            replanning=m.replanning,
            slots=slots.get(name) if slots is not None else None,
            phase=m.phase,
            shown_phase=shown_phase(m),
            wait_reason=reasons.get(name),
            draining_for=m.draining_for,
            memory_need=ledger.estimates.get(name) if ledger else None,
            memory_used=ledger.effective.get(name) if ledger else None,
            memory_reserved=ledger.need(name) if ledger else None,
            memory_source=_memory_source(m, memory, projections),
            memory_high=_projection_high(m, projections),
            cpu=m.cpu if m.is_running else None,
            cpu_request=m.config.cpu,
            gpu=m.gpu if m.is_running else None,
            gpu_request=m.config.gpu,
        )
        for name, m in sorted(table.models.items())
    }


def _memory_source(
    m: ModelState, memory: MemoryAdmission | None, projections: Projections | None
) -> str | None:
    if memory is None:
        return None
    if projections is not None and projections.of(m.name, m.config.fingerprint):
        return "engine"
    return "estimate" if memory.ledger.estimates.get(m.name) else None


def _projection_high(m: ModelState, projections: Projections | None) -> PerDevice | None:
    if projections is None:
        return None
    found = projections.of(m.name, m.config.fingerprint)
    return found.high if found is not None else None
