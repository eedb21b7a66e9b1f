"""What every settle rule works on: the core's parts, and `Rule`, the shape of a rule."""

from __future__ import annotations

import attrs

from troupe.sched.admission import MemoryAdmission
from troupe.sched.children import Children, CrashRecord
from troupe.sched.drain import DrainClock
from troupe.sched.effects import Grant
from troupe.sched.fair import Fair
from troupe.sched.gate import LoadGate
from troupe.sched.limits import Limits
from troupe.sched.outbox import Outbox
from troupe.sched.placement import Placement
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reloads import CatalogChanges
from troupe.sched.requests import Lease, Requests
from troupe.sched.table import ModelConfig, ModelState, ModelTable
from troupe.sched.terms import DEFAULT_TERMS, TenantTerms

__all__ = ["Parts", "Rule"]


@attrs.define(eq=False)
class Parts:
    """The core's parts a rule reads and changes (the core owns them all)."""

    limits: Limits
    table: ModelTable
    queue: AdmissionQueue
    requests: Requests
    changes: CatalogChanges
    children: Children
    crashes: CrashRecord
    clock: DrainClock
    memory: MemoryAdmission | None
    projections: Projections | None
    out: Outbox
    placement: Placement
    gate: LoadGate
    fair: Fair  # slots, tenants' attained service, max_parallel (sched.fair)
    # This settle called off a narrowed model's restart (`Replans`): a parked POST
    # /models/load that waited for it picks its victim in the same settle.
    called_off: bool = False

    def has_capacity(self) -> bool:
        return self.gate.has_capacity()

    def queue_state(self) -> tuple[list[tuple[str, bool, int]], int]:
        entries = [(e.model, e.loading, e.waiters) for e in self.queue.entries]
        return entries, len(self.requests.waiters)

    def grant(
        self,
        rid: int,
        m: ModelState,
        update_last_used: bool,
        now: float,
        *,
        waited: bool,
        terms: TenantTerms = DEFAULT_TERMS,
        slot: bool = False,
    ) -> None:
        if update_last_used:
            m.last_used = now
        m.in_flight += 1
        self.clock.lease_taken()
        self.requests.leases[rid] = Lease(m.name, m.gen, terms.tenant, terms.priority, slot)
        if slot:
            self.fair.granted(m, terms.tenant)
        self.out.reply(rid, Grant(m.name, m.port, m.gen, waited))

    def forget_measurement(self, name: str) -> None:
        if self.projections is not None:
            self.projections.forget(name)

    def apply_estimate(self, config: ModelConfig) -> None:
        """The best figure known for ``config`` before it runs: the engine's projection
        for this command line, else the catalog's estimate."""
        if self.projections is not None:
            self.projections.estimate(config)
        elif self.memory is not None:
            self.memory.ledger.set_estimate(config.name, config.need)


class Rule:
    """One named step of the settle. `due` is cheap and says whether `run` could change
    anything now: a settle runs only the rules that are due (a release on a loaded model
    with nobody waiting runs none of the queue's)."""

    def __init__(self, parts: Parts) -> None:
        self.p = parts

    def due(self) -> bool:
        return True

    def run(self, now: float) -> None:
        raise NotImplementedError
