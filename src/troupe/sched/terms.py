"""What the scheduler's core needs of a tenant, as plain values (`TenantTerms`).

Defined here, in the pure core, so the core never imports the tenant book
(`troupe.tenants.model` re-exports it and builds it: `Tenants.terms`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_TERMS", "TenantTerms"]


@dataclass(frozen=True, slots=True)
class TenantTerms:
    """A request's tenant as the core sees it. With no keys every request has the
    default terms (tenant "", weight 1, no class, no limit): today's behaviour."""

    tenant: str = ""
    weight: float = 1.0
    priority: int = 0  # its class's: higher is granted first when slots are scarce
    reserved_slots: int = 0  # its class's: slots per model kept for it (or higher)
    max_parallel: int | None = None  # its slot-using requests in flight at once
    # Slots per model kept for the classes ranked above this tenant's (the sum of their
    # ``reserved_slots``): this tenant may not take the last ones of them.
    held_back: int = 0


DEFAULT_TERMS = TenantTerms()
