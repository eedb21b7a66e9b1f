"""A child's own news and what it does to its model: its process started, it reported a
state, it is gone (an OOM death while loading is tried once more after evictions; a
crash counts toward a hold)."""

from __future__ import annotations

from typing import Any

from troupe.sched.admission import MemoryAdmission
from troupe.sched.children import Children, CrashRecord
from troupe.sched.events import ChildExited, StatusChanged
from troupe.sched.lru import pick_victim
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase, Restart
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.requests import Requests
from troupe.sched.status import Status
from troupe.sched.table import ModelState, ModelTable

__all__ = ["ChildReports"]

# A child's state line: the phase it puts its model in, and the status its event says.
_REPORTED = {
    "loading": (Phase.LOADING, Status.LOADING),
    "ready": (Phase.LOADED, Status.LOADED),
    "sleeping": (Phase.SLEEPING, Status.SLEEPING),
}


class ChildReports:
    """Each method returns whether the table changed (the core then settles)."""

    def __init__(
        self,
        table: ModelTable,
        queue: AdmissionQueue,
        requests: Requests,
        children: Children,
        crashes: CrashRecord,
        memory: MemoryAdmission | None,
        projections: Projections | None,
        outbox: Outbox,
    ) -> None:
        self._table = table
        self._queue = queue
        self._requests = requests
        self._children = children
        self._crashes = crashes
        self._memory = memory
        self._projections = projections
        self._out = outbox

    def spawned(self, model: str, gen: int, port: int, pid: int, now: float) -> bool:
        m = self._table.current(model, gen)
        if m is None or not m.spawn_pending:
            return False
        self._children.started(m, port, pid, now)
        return True

    def state(self, model: str, gen: int, state: str, payload: Any, now: float) -> bool:
        """A ``cmd_child_to_router:state:`` line; an unknown state is ignored."""
        m = self._table.current(model, gen)
        report = _REPORTED.get(state)
        if m is None or report is None or not m.is_running or m.spawn_pending:
            return False
        reported, says = report
        m.reported = reported
        m.exit_code = 0
        if m.phase not in (Phase.DRAINING, Phase.STOPPING):
            m.move(reported)  # a draining or stopping child keeps its course
        event = StatusChanged(model, says)
        if reported is Phase.LOADING:
            m.progress = payload if isinstance(payload, dict) else None
            event = StatusChanged(model, says, progress=payload)
        elif reported is Phase.LOADED:
            self._came_up(m, payload, now)
            # Upstream: any non-empty payload is the info.
            event = StatusChanged(model, says, info=payload or None)
        elif self._memory is not None:
            self._memory.changed(released=True)  # a sleeping child gives its memory back
        self._out.emit(event)
        return True

    def _came_up(self, m: ModelState, payload: Any, now: float) -> None:
        m.progress = None
        if payload and isinstance(payload, dict):
            m.loaded_info = payload
        if m.load_started is not None:
            m.last_load_seconds = now - m.load_started
            m.load_started = None
        if m.in_flight == 0:
            m.idle_since = now
        m.oom_retried = False
        if self._memory is not None:
            self._memory.changed()
            self._memory.came_up(now)
        if self._projections is not None:
            self._projections.again_after_load(m.name)

    def exited(
        self,
        model: str,
        gen: int,
        code: int,
        now: float,
        *,
        expected: bool,
        detail: str | None,
        oom: bool,
        oom_device: str | None = None,
    ) -> bool:
        """The child of generation ``gen`` is gone. ``code`` is upstream's (a signal is 1);
        ``oom``: its log said it ran out of memory."""
        m = self._table.current(model, gen)
        if m is None or not m.is_running:
            return False
        was_running = m.announced
        was_loading = m.child_loading
        was_stopping = m.stopping
        entry = self._queue.find(model)
        if entry is not None and entry.loading:
            # The claimed load died: the entry is back in line, so its other waiters (and
            # everyone queued behind it) are not stranded behind a claim that is over.
            self._queue.claim_failed(model)
        if self._memory is not None:
            self._memory.changed(released=True)
        m.reported = None
        m.spawn_pending = False
        m.delay_until = None
        m.exit_code = code
        m.drain_for = None
        m.in_flight = 0  # leases on the dead child no longer count (see release)
        m.progress = None
        m.load_started = None
        if detail:
            m.last_error = detail
        victims = self._oom_victims(m, oom_device) if oom and was_loading and not expected else []
        if victims and not was_stopping:
            m.move(Phase.UNLOADED, Restart.OOM)  # its waiters keep waiting for the second try
        elif not expected and self._crashes.crashed(m, now):
            m.move(Phase.HELD)
        elif was_stopping and m.last_stop is not None and m.last_stop.reason is StopReason.REPLAN:
            m.exit_code = 0  # asked for, not a failure (a load it killed exits 1)
            m.move(Phase.UNLOADED, Restart.REPLAN)  # started again at once, on its narrower lane
        else:
            m.move(Phase.UNLOADED)  # failed, if its exit code says so
        self._children.free_cpus(m)
        if was_running:
            self._out.emit(StatusChanged(model, Status.UNLOADED, exit_code=code))
            # troupe's own: did troupe ask for it, and was it OOM (metrics, logs, dashboard)
            self._out.emit(ChildExited(model, code, expected, oom))
        if m.restart is Restart.OOM:
            # A load that died of OOM while idle models were resident: evict them all and
            # try once more.
            m.oom_retried = True
            for victim in victims:
                cause = StopCause(StopReason.MEMORY, model)
                v = self._table.models[victim]
                if v.restart is Restart.REPLAN:
                    v.last_stop = cause  # its start on a narrower lane is called off
                    v.move(Phase.UNLOADED)
                elif v.stopping:
                    v.last_stop = cause  # stopping for a re-plan already: not started again
                else:
                    self._children.stop(v, cause, now)
        if self._table.retiring(model):
            self._table.drop(model)
        return True

    def _oom_victims(self, m: ModelState, device: str | None = None) -> list[str]:
        """The idle models to evict so that a load that died of OOM may be tried once
        more (none if it was tried again already, or is leaving the table); those holding
        memory on ``device`` only, when the log named the device it ran out of."""
        if m.oom_retried or self._table.retiring(m.name):
            return []
        elsewhere: list[str] = []
        if device is not None and self._memory is not None:
            ledger = self._memory.ledger
            elsewhere = [
                o.name
                for o in self._table
                if o.is_running and not ledger.holds_on(o.name, [device])
            ]
        # Idle models on their way to a narrower lane (a re-plan) are resident, or about
        # to be again: they go too, their restart called off.
        waited = {w.model for w in self._requests.waiters.values()}
        waited |= {d.model for d in self._requests.direct.values()}
        victims = [
            o.name
            for o in self._table
            if o is not m
            and _replanned(o)
            and not o.pin
            and o.name not in waited
            and o.name not in elsewhere
        ]
        while True:
            skip = [m.name, *victims, *elsewhere]
            victim = pick_victim(self._table.models, self._queue, exclude=skip)
            if victim is None:
                return victims
            victims.append(victim)


def _replanned(o: ModelState) -> bool:
    if o.restart is Restart.REPLAN:
        return True
    if o.replanned and o.child_loading and not o.in_flight:
        return True  # started again on its narrower lane, nobody's request on it
    return o.stopping_to_replan
