"""Settling: after every event, the rules of `troupe.sched.rules` in their order.

`Settler` holds no state of its own: it gives the rules the core's parts
(`troupe.sched.rules.parts.Parts`) and runs each rule that is due, in `RULES` order.
The core also asks it for a lease granted at once (`grant`) and, when the drain
clock is due, for a drain (`start_drain`).
"""

from __future__ import annotations

from troupe.sched.admission import MemoryAdmission
from troupe.sched.children import Children, CrashRecord
from troupe.sched.drain import DrainClock
from troupe.sched.fair import Fair
from troupe.sched.gate import LoadGate
from troupe.sched.limits import FAKE_TIMING_DELAY, Limits
from troupe.sched.outbox import Outbox
from troupe.sched.placement import Placement
from troupe.sched.projections import Projections
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reloads import CatalogChanges
from troupe.sched.requests import Requests
from troupe.sched.rules import RULES, Parts, start_drain
from troupe.sched.table import ModelState, ModelTable
from troupe.sched.terms import DEFAULT_TERMS, TenantTerms

__all__ = ["FAKE_TIMING_DELAY", "Limits", "Settler"]


class Settler:
    def __init__(
        self,
        limits: Limits,
        table: ModelTable,
        queue: AdmissionQueue,
        requests: Requests,
        changes: CatalogChanges,
        children: Children,
        crashes: CrashRecord,
        clock: DrainClock,
        memory: MemoryAdmission | None,
        projections: Projections | None,
        outbox: Outbox,
        placement: Placement,
        fair: Fair | None = None,
    ) -> None:
        self.limits = limits
        self.gate = LoadGate(
            limits.models_max, table, queue, clock, memory, projections, children, outbox,
            placement,
        )  # fmt: skip
        self.placement = placement
        self.parts = Parts(
            limits, table, queue, requests, changes, children, crashes, clock, memory,
            projections, outbox, placement, self.gate, fair if fair is not None else Fair(),
        )  # fmt: skip
        self.fair = self.parts.fair
        self.rules = tuple(rule(self.parts) for rule in RULES)
        self.rules_run = 0  # rules run since the start (bench/settle.py reads it)

    def has_capacity(self) -> bool:
        return self.gate.has_capacity()

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
        self.parts.grant(rid, m, update_last_used, now, waited=waited, terms=terms, slot=slot)

    def start_drain(self, now: float) -> None:
        start_drain(self.parts, now)

    def settle(self, now: float) -> None:
        """Run each rule that is due, in `RULES` order."""
        self.parts.called_off = False
        for rule in self.rules:
            if rule.due():
                self.rules_run += 1
                rule.run(now)
