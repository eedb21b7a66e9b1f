"""CPU placement at admission: the lane a model's child gets, and re-planning a child
that is wider than its lane may be now (see `troupe.sched.cpu` for the policy).

A model whose lane is held by a wider child never waits for it: it starts at once on
the cores that child will give up (a shared lane until then), and the wider child is
narrowed as soon as it can be: at once when idle; when busy, it takes no new request,
finishes the ones it has (the drain's mechanism), stops, and is started again on its
narrower lane (`Restart.REPLAN`); a child still loading is narrowed once it is ready.
A user's long answer on one model therefore never holds another model's load back.
"""

from __future__ import annotations

from troupe.sched.children import Children
from troupe.sched.cpu import CpuLedger, CpuPlan
from troupe.sched.events import DrainStarted
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase, Restart
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.table import ModelState, ModelTable

__all__ = ["Placement"]


WIDEN_AFTER = 10.0  # seconds a narrow child idles alone before it is started again wider


class Placement:
    def __init__(
        self,
        ledger: CpuLedger | None,
        table: ModelTable,
        children: Children,
        outbox: Outbox,
        queue: AdmissionQueue,
    ) -> None:
        self.ledger = ledger
        self._table = table
        self._queue = queue
        self._children = children
        self._out = outbox
        self._planned: dict[str, CpuPlan] = {}  # admitted, not spawned yet
        self._reserved: set[str] = set()  # waiting for a re-plan made for them

    def admits(self, m: ModelState, now: float) -> bool:
        """Is there a lane for ``m`` now? Always, once a wider child holding it is being
        narrowed (see `narrow`); models placed by their own flags always are."""
        ledger = self.ledger
        if ledger is None or m.config.cpu is not None:
            return True
        plan, _ = ledger.borrow(m.name, self._beside(m.name))
        if plan is None:
            self._reserved.add(m.name)
            return False
        self._planned[m.name] = plan
        return True

    def must_narrow(self, m: ModelState) -> str | None:
        """The placed child ``m``'s lane overlaps while ``m`` is wider than it may be now:
        ``m`` is to be narrowed for it. None: it need not be."""
        if self.ledger is None:
            return None
        return self.ledger.overlapped(m.name, self._beside(m.name))

    def narrow(self, now: float) -> None:
        """Start narrowing each serving child that overlaps a lane given away beside it:
        stopped at once when idle, drained when busy (stopped once its requests end)."""
        for o in list(self._table):
            if not o.phase.serves or o.stopping or o.phase is Phase.DRAINING:
                continue
            for_model = self.must_narrow(o)
            if for_model is not None:
                self._replan(o, for_model, now)

    def take(self, name: str) -> CpuPlan | None:
        """The lane `admits` found for ``name``, as its spawn starts."""
        self._reserved.discard(name)
        return self._planned.pop(name, None)

    def holds_any(self) -> bool:
        """Lanes are planned or reserved for models not spawned yet."""
        return bool(self._planned or self._reserved)

    def keep_reserved(self, wanted: set[str]) -> None:
        """Reservations last while their model still waits for a load."""
        self._reserved &= wanted
        for name in list(self._planned):
            if name not in wanted:
                del self._planned[name]

    def _narrow(self, now: float) -> list[tuple[float, ModelState]]:
        """Placed children narrower than they may be now, idle: (when to widen, model)."""
        ledger = self.ledger
        if ledger is None:
            return []
        out = []
        for m in self._table:
            plan = ledger.placed.get(m.name)
            if plan is None or not m.phase.serves or m.in_flight:
                continue
            if self._queue.find(m.name) is not None:
                continue
            if len(plan.cores) < ledger.width_for(len(self._beside(m.name)) + 1):
                out.append((m.idle_since + WIDEN_AFTER, m))
        return out

    def widen_deadline(self, now: float) -> float | None:
        return min((t for t, _ in self._narrow(now)), default=None)

    def widen(self, now: float) -> None:
        """A child narrowed beside others that has idled alone (or with fewer) for
        `WIDEN_AFTER` starts again on the wider lane it may have now, between requests:
        one model at a time keeps the engine's full speed."""
        for due, m in self._narrow(now):
            if due <= now:
                self._children.stop(m, StopCause(StopReason.REPLAN), now)
                return  # one at a time: the next plans beside it

    def _beside(self, model: str) -> list[str]:
        """The children that will run beside ``model``: running ones, ones coming back
        on a narrower lane, and the models those re-plans were made for."""
        coming = {o.name for o in self._table if _will_run(o)}
        return sorted((coming | self._reserved) - {model})

    def _replan(self, o: ModelState, for_model: str, now: float) -> None:
        if o.in_flight:
            o.drain_for = for_model
            o.drain_reason = StopReason.REPLAN
            o.move(Phase.DRAINING)
            self._out.emit(DrainStarted(o.name, for_model, o.in_flight))
        else:
            self._children.stop(o, StopCause(StopReason.REPLAN, for_model), now)


def _will_run(o: ModelState) -> bool:
    """Running and staying, or on its way back on a narrower lane (a re-plan)."""
    if o.restart is Restart.REPLAN:
        return True
    if o.stopping:
        return o.stopping_to_replan
    return o.is_running
