"""Saying no: shutdown (answer everyone waiting, start nothing, stop every child) and a
full queue (``--queue-max``: 503 with a Retry-After from measured load times)."""

from __future__ import annotations

from troupe.sched.children import Children
from troupe.sched.effects import Failure
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.requests import Requests
from troupe.sched.settle import Limits
from troupe.sched.table import ModelTable

__all__ = ["DEFAULT_LOAD_SECONDS", "Shutdown", "queue_full"]

DEFAULT_LOAD_SECONDS = 10.0  # a load never measured yet, for Retry-After
_SHUTDOWN = StopCause(StopReason.SHUTDOWN)


class Shutdown:
    def __init__(
        self,
        table: ModelTable,
        queue: AdmissionQueue,
        requests: Requests,
        children: Children,
        projections: Projections | None,
        outbox: Outbox,
    ) -> None:
        self._table = table
        self._queue = queue
        self._requests = requests
        self._children = children
        self._projections = projections
        self._out = outbox

    def begin(self, now: float) -> None:
        """Shutdown begins: requests holding a lease finish, nothing else starts. Every
        waiter and parked load is answered at once, and loads under way are killed (no
        one waits for them)."""
        self._close()
        for m in list(self._table):
            if m.restart is not None:
                m.move(Phase.UNLOADED)  # its second start is called off
            if m.child_loading or m.spawn_pending:
                self._children.stop(m, _SHUTDOWN, now)
        self._measure_no_more()

    def stop_all(self, rid: int, now: float) -> None:
        """Fail every waiter, stop every child; ``rid`` is answered once none runs."""
        self._close()
        for m in list(self._table):
            self._children.stop(m, _SHUTDOWN, now)
        self._measure_no_more()
        self._requests.stop_all.append(rid)

    def _measure_no_more(self) -> None:
        if self._projections is not None:
            self._projections.cancel_all()

    def _close(self) -> None:
        """No new lease or load, and everyone waiting is answered."""
        requests = self._requests
        requests.closed = True
        for wid, w in list(requests.waiters.items()):
            if w.queued:
                self._queue.leave(w.model)
            del requests.waiters[wid]
            self._out.reply(wid, Failure.unavailable("server is shutting down"))
        for did in list(requests.direct):
            del requests.direct[did]
            self._out.reply(did, Failure.unavailable("server is shutting down"))


def queue_full(
    table: ModelTable, queue: AdmissionQueue, requests: Requests, limits: Limits, model: str
) -> Failure:
    """503 with a Retry-After from the measured load times of the models ahead."""
    ahead = [e.model for e in queue.entries]
    if model not in ahead:
        ahead.append(model)
    seconds = 0.0
    for name in ahead:
        m = table.get(name)
        load = m.last_load_seconds if m is not None else None
        seconds += load if load is not None else DEFAULT_LOAD_SECONDS
    message = (
        f"too many requests waiting for models ({len(requests.waiters)}, --queue-max "
        f"{limits.queue_max}); retry in {max(1, round(seconds))} s"
    )
    return Failure(503, message, "unavailable_error", retry_after=max(1.0, seconds))
