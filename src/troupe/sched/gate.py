"""May a model load now? A free slot (``--models-max``) and room in memory, asking for
what it takes when there is none (a reading, one eviction at a time), or, with fair
and memory admission on, the slot of an idle model already on its way out.

`verdict` answers `Load`, or `Wait` with the reason in words (what ``/models`` shows)."""

from __future__ import annotations

from collections.abc import Collection

from troupe.sched.admission import Admit, Evict, MemoryAdmission
from troupe.sched.children import Children
from troupe.sched.drain import DrainClock
from troupe.sched.events import MemoryWarning
from troupe.sched.lru import pick_victim
from troupe.sched.outbox import Outbox
from troupe.sched.placement import Placement
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.table import ModelState, ModelTable
from troupe.sched.verdicts import NO_LANE, NO_SLOT, STOPPING, GateVerdict, Load, Wait

__all__ = ["LoadGate"]


class LoadGate:
    def __init__(
        self,
        models_max: int,
        table: ModelTable,
        queue: AdmissionQueue,
        clock: DrainClock,
        memory: MemoryAdmission | None,
        projections: Projections | None,
        children: Children,
        outbox: Outbox,
        placement: Placement,
    ) -> None:
        self.models_max = models_max
        self.placement = placement
        self._table = table
        self._queue = queue
        self._clock = clock
        self._memory = memory
        self._projections = projections
        self._children = children
        self._out = outbox

    def has_capacity(self) -> bool:
        # A pending spawn counts: two claims must never share one slot.
        models_max = self.models_max
        return models_max <= 0 or self._table.running_count() < models_max

    def verdict(self, m: ModelState, now: float) -> GateVerdict:
        """May queued model ``m`` load now: a free slot and room in memory, or (see
        `_starts_beside_leaving`) a slot whose model is already on its way out; and a
        CPU lane (`Placement`)."""
        if self.has_capacity():
            fits = self.memory_verdict(m, now)
            if isinstance(fits, Wait):
                return fits
        elif not self._starts_beside_leaving(m):
            return self.wait(m, NO_SLOT)
        if self.placement.admits(m, now):
            return Load()
        return self.wait(m, NO_LANE)

    def wait(self, m: ModelState, otherwise: str) -> Wait:
        """Wait, for what frees room first: a model drained for ``m``, any stop."""
        table = self._table
        draining = next((o.name for o in table if o.draining_for == m.name), None)
        if draining is not None:
            why = f"waiting for {draining} to finish its requests (swapped out for it)"
            return Wait(why, otherwise)
        if table.any_stopping():
            return Wait(STOPPING, otherwise)
        return Wait(otherwise, otherwise)

    def _starts_beside_leaving(self, m: ModelState) -> bool:
        """With fair admission and memory admission on, a model takes the slot of an idle
        one that has been told to exit without waiting for it to be gone, when a reading
        with nothing started since shows room for both (the leaving child still counted):
        a swap costs the next cold start, not that plus the victim's exit. Upstream (and
        ``--drain-after off``) counts a stopping model as running until it exits."""
        memory = self._memory
        if not self._clock.fair or memory is None or memory.ledger.need(m.name) is None:
            return False
        table = self._table
        leaving = sum(1 for o in table if o.is_running and o.stopping and not o.in_flight)
        if table.running_count() - leaving >= self.models_max:
            return False
        if self._projections is not None and self._projections.pending(m.name):
            self._projections.bump(m.name)  # its projection first, as `memory_admits`
            return False
        holders = table.memory_holders()
        if any(memory.ledger.need(h) is None for h in holders if h != m.name):
            # A model of unknown need holds memory neither the ledger nor (before it is
            # up) a reading counts: the reading cannot show room for both.
            return False
        fits = memory.fits_now(m.name, holders, m.config)
        if fits is None:
            self._children.ask_memory()  # normally asked for already, when the victim was told
            return False
        return fits

    def memory_admits(self, m: ModelState, now: float) -> bool:
        """`memory_verdict` as a yes or no."""
        return isinstance(self.memory_verdict(m, now), Load)

    def memory_verdict(self, m: ModelState, now: float) -> GateVerdict:
        """Does ``m`` fit in memory with the margin? If not, ask for what it takes (a fresh
        reading, one eviction at a time) and say why the caller waits."""
        memory = self._memory
        name = m.name
        if memory is None:
            return Load()
        projections = self._projections
        if projections and projections.pending(name) and not memory.ledger.effective.get(name):
            # Measured first (the engine's projection takes a fraction of a second;
            # a failure or a timeout falls back to the estimate).
            projections.bump(name)
            return self.wait(m, "waiting for memory: its need is being measured")
        table = self._table
        verdict, read = memory.verdict(
            name,
            table.memory_holders(),
            stopping=table.any_stopping(),
            victim=lambda devices: pick_victim(
                table.models,
                self._queue,
                exclude=(name, *self._elsewhere(memory, devices)),
            ),
            config=m.config,
            pinned=[o.name for o in table if o.pin and o.is_running],
        )
        if read:
            self._children.ask_memory()
        if isinstance(verdict, Evict):
            cause = StopCause(StopReason.MEMORY, name)
            self._children.stop(table.models[verdict.victim], cause, now)
            return Wait(STOPPING, "waiting for memory")
        if isinstance(verdict, Admit):
            if verdict.warning is not None:
                self._out.emit(MemoryWarning(name, verdict.warning))
            return Load()
        return self.wait(m, "waiting for memory")

    def _elsewhere(self, memory: MemoryAdmission, devices: Collection[str]) -> list[str]:
        """Running models that hold nothing on ``devices``: evicting one frees no room
        where it is needed."""
        ledger = memory.ledger
        return [
            o.name for o in self._table if o.is_running and not ledger.holds_on(o.name, devices)
        ]
