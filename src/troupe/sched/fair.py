"""Fair queuing across tenants: who gets a loaded model's next slot (pure; the clock is
passed in).

A child serves ``--parallel`` requests at once (its slots); beyond that the engine
queues them in its own FIFO, so a script with 200 queued requests held every slot and
an interactive user waited behind all of them. The core now grants a loaded model at
most as many slot-using leases as its child has slots, and queues the rest itself.
Requests that occupy no slot (``/tokenize``, ``/props``, ``/health``, ``/slots``...)
are never counted and never wait here.

When a slot frees, the next grant goes, among the requests waiting for that model:

1. by class priority (higher first); a class may keep ``reserved_slots`` per model for
   itself and the classes above it (`TenantTerms.held_back`: what a request of a lower
   class may not take; at least one slot is always left to every class);
2. then to the tenant with the least attained service: the tokens its answers used
   (prompt + generated), halved every `HALF_LIFE` seconds, plus `typical` tokens for
   each of its requests in flight (so a burst of grants to one tenant counts before
   its answers end), divided by its weight;
3. then first come, first served (request ids grow with arrival).

A tenant passed over `MAX_BYPASS` times in a row by grants to tenants of its own
priority, while it had an earlier request that could have taken the slot, goes first
next (within its priority; among several such, the one passed over most): no
backlogged tenant waits forever, whatever the others' service. It is passed over at
most ``MAX_BYPASS + tenants - 1`` times (each other tenant passed over as often goes
once first). ``max_parallel`` is never exceeded: such a request waits.

Nothing here runs on a timer: service decays lazily when read, and a tenant with
nothing queued and nothing in flight holds no entry but its decaying service figure
(pruned once negligible).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from troupe.sched.lru import DEMAND_TAU
from troupe.sched.requests import Requests, Waiter
from troupe.sched.table import ModelState, ModelTable
from troupe.sched.terms import DEFAULT_TERMS, TenantTerms

__all__ = [
    "DEFAULT_SLOTS",
    "HALF_LIFE",
    "MAX_BYPASS",
    "TENANT_DEMAND_CAP",
    "Fair",
    "TenantTerms",
]

# llama-server's slot count when its command line sets none (``--parallel -1``, auto:
# 4 slots sharing one cache; troupe.hardware.estimate.AUTO_PARALLEL).
DEFAULT_SLOTS = 4
# Attained service halves every minute: long enough that a tenant's last few answers
# (seconds to tens of seconds each) still count when the next grant is chosen, short
# enough that a flood an hour ago does not put a tenant behind everyone now.
HALF_LIFE = 60.0
# Grants to others of the same priority a waiting tenant is passed over before it goes
# first: above any sensible weight ratio (weights 10:1 pass the light tenant over ~10
# times in a row), so it only ever decides for a tenant LAS would leave waiting.
MAX_BYPASS = 32
# A model's demand (eviction and drain choices, sched.lru): one tenant's requests count
# at most this much, decayed like the rest, so one tenant's flood weighs like a few
# requests and cannot make its model outrank every other tenant's. The tenant "" (no
# keys: everyone) is not capped: demand stays what it was.
TENANT_DEMAND_CAP = 4.0
TYPICAL_START = 256.0  # tokens an answer is taken to use before any answer is known
_NEGLIGIBLE = 1e-3
_PRUNE_AT = 64  # entries kept before negligible ones are dropped


class Fair:
    """The per-tenant part of the core: attained service, slot counts, bypasses."""

    def __init__(self, half_life: float = HALF_LIFE, max_bypass: int = MAX_BYPASS) -> None:
        self._decay = math.log(2) / half_life
        self.max_bypass = max_bypass
        self._service: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, as of)
        # Tokens an answer whose usage is unknown is charged, and what a request in
        # flight counts for: the mean of the known answers (a running average).
        self.typical = TYPICAL_START
        self._known = 0
        self._slots: dict[str, tuple[int, int]] = {}  # model -> (gen, its child's slots)
        self._busy: dict[tuple[str, int], int] = {}  # (model, gen) -> slot-using leases
        self._running: dict[str, int] = {}  # tenant -> its slot-using leases (all models)
        self._bypassed: dict[str, int] = {}  # tenant -> grants to others it was passed over
        self._demand: dict[str, dict[str, tuple[float, float]]] = {}  # model -> tenant ->

    # ----- slots ------------------------------------------------------------------------

    def learn_slots(self, model: str, gen: int, slots: int) -> None:
        """Child ``gen`` of ``model`` serves ``slots`` requests at once."""
        self._slots[model] = (gen, max(1, slots))

    def slots_of(self, m: ModelState) -> int:
        known = self._slots.get(m.name)
        return known[1] if known is not None and known[0] == m.gen else DEFAULT_SLOTS

    def busy(self, m: ModelState) -> int:
        return self._busy.get((m.name, m.gen), 0)

    def running(self, tenant: str) -> int:
        return self._running.get(tenant, 0)

    def admits(self, m: ModelState, terms: TenantTerms, requests: Requests) -> bool:
        """May a slot-using request of ``terms`` take a slot of ``m`` now (a free slot,
        under its ``max_parallel``, not one kept for a class above its own)?"""
        slots, busy = self.slots_of(m), self.busy(m)
        if busy >= slots:
            return False
        if terms.max_parallel is not None and self.running(terms.tenant) >= max(
            1, terms.max_parallel
        ):
            return False
        if terms.held_back > 0:
            kept = min(terms.held_back, slots - 1)  # every class keeps one slot it may use
            above = sum(
                1
                for lease in requests.leases.values()
                if lease.slot
                and lease.priority > terms.priority
                and (lease.model, lease.gen) == (m.name, m.gen)
            )
            if slots - busy <= max(0, kept - above):
                return False
        return True

    def free_now(self, m: ModelState, terms: TenantTerms, requests: Requests) -> bool:
        """Would a new slot-using request for ``m`` be granted at once? Whenever it may
        take a slot: after every event `grant_waiting` has run, so a request still
        waiting for one of ``m``'s slots is one that may not take the free ones (its
        max_parallel, a slot kept for a class above its own), and nobody goes first."""
        return self.admits(m, terms, requests)

    def granted(self, m: ModelState, tenant: str) -> None:
        key = (m.name, m.gen)
        self._busy[key] = self._busy.get(key, 0) + 1
        self._running[tenant] = self._running.get(tenant, 0) + 1

    def released(self, model: str, gen: int, tenant: str, tokens: int | None, now: float) -> None:
        """A slot-using lease ended; its answer used ``tokens`` (None: unknown, charged
        `typical`)."""
        key = (model, gen)
        if (n := self._busy.get(key, 0) - 1) > 0:
            self._busy[key] = n
        else:
            self._busy.pop(key, None)
        if (n := self._running.get(tenant, 0) - 1) > 0:
            self._running[tenant] = n
        else:
            self._running.pop(tenant, None)
        if tokens is not None and tokens >= 0:
            self._known += 1
            self.typical += (tokens - self.typical) / min(self._known, 100)
        self.serve(tenant, self.typical if tokens is None or tokens < 0 else tokens, now)

    # ----- attained service -----------------------------------------------------------------

    def serve(self, tenant: str, tokens: float, now: float) -> None:
        self._service[tenant] = (self.attained(tenant, now) + tokens, now)
        if len(self._service) > _PRUNE_AT:
            self._service = {
                t: v for t, v in self._service.items() if self.attained(t, now) > _NEGLIGIBLE
            }

    def attained(self, tenant: str, now: float) -> float:
        found = self._service.get(tenant)
        if found is None:
            return 0.0
        tokens, at = found
        return tokens * math.exp(-self._decay * max(0.0, now - at))

    def share(self, terms: TenantTerms, now: float) -> float:
        """Attained service per weight, counting requests in flight at `typical` each."""
        served = self.attained(terms.tenant, now) + self.running(terms.tenant) * self.typical
        return served / max(terms.weight, 1e-9)

    # ----- the grant ------------------------------------------------------------------------

    def grant_waiting(
        self,
        table: ModelTable,
        requests: Requests,
        now: float,
        grant: Callable[[int, Waiter, ModelState], None],
    ) -> None:
        """Give each loaded model's free slots to the requests waiting for them, in the
        order this module's docstring gives; ``grant`` leases one (and counts it here)."""
        groups: dict[str, list[tuple[int, Waiter]]] = {}
        for rid, w in requests.waiters.items():
            if w.slot_wait:
                groups.setdefault(w.model, []).append((rid, w))
        for model, group in groups.items():
            m = table.known(model)
            if m is None or not m.phase.serves:
                continue
            while group:
                eligible = [(rid, w) for rid, w in group if self.admits(m, w.terms, requests)]
                if not eligible:
                    break
                rid, w = min(eligible, key=lambda e: self._order(e[0], e[1].terms, now))
                passed = {
                    o.terms.tenant
                    for orid, o in eligible
                    if orid < rid
                    and o.terms.tenant != w.terms.tenant
                    and o.terms.priority == w.terms.priority
                }
                for tenant in passed:
                    self._bypassed[tenant] = self._bypassed.get(tenant, 0) + 1
                self._bypassed.pop(w.terms.tenant, None)
                group.remove((rid, w))
                grant(rid, w, m)
        if self._bypassed:  # a tenant with nobody waiting is forgotten
            waiting = {w.terms.tenant for w in requests.waiters.values()}
            self._bypassed = {t: n for t, n in self._bypassed.items() if t in waiting}

    def bypassed(self, tenant: str) -> int:
        return self._bypassed.get(tenant, 0)

    @property
    def remembers_bypasses(self) -> bool:
        """Some tenant's bypass count is kept (forgotten once it has nobody waiting)."""
        return bool(self._bypassed)

    def _order(self, rid: int, terms: TenantTerms, now: float) -> tuple[int, int, float, int]:
        passed = self._bypassed.get(terms.tenant, 0)
        urgency = passed if passed >= self.max_bypass else 0  # passed over too often
        return (-terms.priority, -urgency, self.share(terms, now), rid)

    # ----- demand by tenant -----------------------------------------------------------------

    def demand_step(self, model: str, terms: TenantTerms, now: float) -> float:
        """How much one more request of ``terms`` adds to ``model``'s demand: 1, less once
        its tenant's own decayed share nears `TENANT_DEMAND_CAP` (tenant "": always 1)."""
        if terms is DEFAULT_TERMS or not terms.tenant:
            return 1.0
        per = self._demand.setdefault(model, {})
        value, at = per.get(terms.tenant, (0.0, now))
        value *= math.exp(-max(0.0, now - at) / DEMAND_TAU)
        new = min(value + 1.0, TENANT_DEMAND_CAP)
        per[terms.tenant] = (new, now)
        if len(per) > _PRUNE_AT:
            self._demand[model] = {
                t: (v, a)
                for t, (v, a) in per.items()
                if v * math.exp(-max(0.0, now - a) / DEMAND_TAU) > _NEGLIGIBLE
            }
        return max(0.0, new - value)
