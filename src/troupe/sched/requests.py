"""Who is waiting for the core's answer, and who holds a lease."""

from __future__ import annotations

import attrs

from troupe.sched.terms import DEFAULT_TERMS, TenantTerms

__all__ = ["DirectLoad", "Lease", "Requests", "Waiter"]


@attrs.define
class Waiter:
    """A request waiting for its model (upstream's ``ensure_model_ready`` loop)."""

    model: str
    update_last_used: bool
    queued: bool = False  # holds a share of the model's queue entry
    did_load: bool = False  # this waiter's claim spawned the model
    saw_loading: bool = False
    since: float = 0.0  # when it arrived: a grant in that same event did not wait
    terms: TenantTerms = DEFAULT_TERMS  # whose request (sched.fair)
    slot: bool = False  # it occupies one of the child's slots (sched.fair caps those)
    slot_wait: bool = False  # its model serves; it waits for a slot (sched.fair grants)
    autoload: bool = True  # False: it may not load the model (it waits for a slot only)


@attrs.define
class Lease:
    model: str
    gen: int
    tenant: str = ""
    priority: int = 0
    slot: bool = False  # counted against the child's slots and the tenant's max_parallel


@attrs.define
class DirectLoad:
    """A ``POST /models/load`` waiting for the LRU victim it stopped to be gone."""

    model: str
    victim: str | None
    victim_gen: int = 0  # the victim's child we wait for; a newer one is not ours to wait on
    # LLAMA_SERVER_DEBUG_FAKE_TIMING: upstream's load() first sleeps 2 s (after the "model
    # is already running" check), so this load does nothing before then.
    not_before: float = 0.0


@attrs.define
class Requests:
    """Every request the core has not finished with, by request id."""

    waiters: dict[int, Waiter] = attrs.field(factory=dict)
    leases: dict[int, Lease] = attrs.field(factory=dict)
    direct: dict[int, DirectLoad] = attrs.field(factory=dict)
    stop_all: list[int] = attrs.field(factory=list)  # shutdowns, answered once none runs
    # keep_alive 0 asked with nothing to generate (Ollama): rid -> the child (model, gen)
    # whose end it is answered at
    until_gone: dict[int, tuple[str, int]] = attrs.field(factory=dict)
    closed: bool = False  # shutting down: no new lease, no new load

    def wanted(self) -> list[str]:
        """Models that parked loads wait for, in order (their projections go first)."""
        return [d.model for d in self.direct.values()]
