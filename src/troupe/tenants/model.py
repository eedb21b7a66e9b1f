"""The tenant book: each key's tenant (name, class, weight, models, admin, limits).

Plain immutable data; the file format is read by `troupe.tenants.file`. The scheduler's
pure core never imports this module: what it needs of a tenant (name, weight, class
priority, reserved slots, ``max_parallel``) travels in the request's message as plain
values (`TenantTerms`).

With no tenants file, the keys from ``--api-key``/``--api-key-file``/``--named-api-keys``
become tenants of the default class with every right (`Tenants.from_keys`): one key is
one admin tenant, as upstream; several keys are several admin tenants, private from
each other (the hardening issue's isolation).
"""

from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from troupe.sched.terms import TenantTerms  # the core's own type: sched imports no tenants

__all__ = ["DEFAULT_CLASS", "Limits", "Tenant", "TenantClass", "TenantTerms", "Tenants"]

DEFAULT_CLASS = "default"


@dataclass(frozen=True, slots=True)
class Limits:
    """None means no limit."""

    max_parallel: int | None = None  # requests of this tenant in flight at once
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + generated, reserved at admission
    tokens_per_day: int | None = None  # the daily budget (UTC days)


@dataclass(frozen=True, slots=True)
class TenantClass:
    name: str
    priority: int = 0  # higher is served first when slots or loads are scarce
    reserved_slots: int = 0  # slots per model kept for this class (others may not take them)
    default_max_tokens: int = 1024  # reserved when a request names no max_tokens/n_predict


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    key: str = field(repr=False)  # the secret; never logged, never in repr
    klass: str = DEFAULT_CLASS
    weight: float = 1.0
    models: tuple[str, ...] = ("*",)  # names or globs (fnmatch) this tenant may use
    admin: bool = True  # may load/unload/pull/delete/reload models
    limits: Limits = Limits()

    def may_use(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)


@dataclass(frozen=True)
class Tenants:
    tenants: tuple[Tenant, ...] = ()
    classes: Mapping[str, TenantClass] = field(
        default_factory=lambda: {DEFAULT_CLASS: TenantClass(DEFAULT_CLASS)}
    )
    from_file: bool = False  # a tenants file was given (rights and limits apply)

    @classmethod
    def from_keys(cls, keys: Sequence[str], names: Sequence[str] = ()) -> Tenants:
        """Keys without a tenants file: each an admin tenant of the default class."""
        return cls(
            tuple(
                Tenant(names[i] if i < len(names) and names[i] else f"key-{i + 1}", key)
                for i, key in enumerate(keys)
            )
        )

    def __bool__(self) -> bool:
        return bool(self.tenants)

    def __len__(self) -> int:
        return len(self.tenants)

    def match(self, given: str) -> Tenant | None:
        """The tenant whose key ``given`` is, or None. Every key is compared, in constant
        time, every time: neither which key matched nor how much of a guess was right
        shows in the timing."""
        raw = given.encode("utf-8", "surrogateescape")
        found: Tenant | None = None
        for tenant in self.tenants:
            if hmac.compare_digest(tenant.key.encode("utf-8"), raw) and found is None:
                found = tenant
        return found

    def named(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants if t.name == name), None)

    @property
    def private(self) -> bool:
        """Whether tenants are kept apart: several of them, or a tenants file. Else one
        tenant, "", for whom every record is everyone's (as upstream)."""
        return self.from_file or len(self.tenants) > 1

    def owner(self, name: str) -> str:
        """Whose request one by tenant ``name`` is, for records, conversations and the KV
        store: ``name`` when tenants are kept apart, else ""."""
        return name if self.private else ""

    def viewer(self, name: str) -> str:
        """Whose records tenant ``name`` sees ("" means everyone's): its own when tenants
        are kept apart, unless a tenants file makes it admin."""
        if not self.private:
            return ""
        tenant = self.named(name)
        return "" if self.from_file and tenant is not None and tenant.admin else name

    def allows(self, name: str, models: Iterable[str]) -> bool:
        """Whether tenant ``name`` may use a model known by ``models`` (its name and its
        aliases). No keys, or no key needed (""): yes. A name not in the book (removed
        by a reload while its request was on its way): no."""
        if not name or not self.tenants:
            return True
        tenant = self.named(name)
        return tenant is not None and any(tenant.may_use(m) for m in models)

    def may_admin(self, name: str) -> bool:
        """Whether tenant ``name`` may load, unload, pull, delete and reload."""
        if not name or not self.tenants:
            return True
        tenant = self.named(name)
        return tenant is not None and tenant.admin

    def klass(self, tenant: Tenant) -> TenantClass:
        return self.classes.get(tenant.klass) or TenantClass(tenant.klass)

    def terms(self, name: str) -> TenantTerms:
        """The core's view of tenant ``name`` ("" or unknown: the default terms)."""
        tenant = self.named(name)
        if tenant is None:
            return TenantTerms(tenant=name)
        k = self.klass(tenant)
        return TenantTerms(
            tenant=tenant.name,
            weight=tenant.weight,
            priority=k.priority,
            reserved_slots=k.reserved_slots,
            max_parallel=tenant.limits.max_parallel,
            # Slots per model the classes ranked above this one keep for themselves.
            held_back=sum(
                c.reserved_slots for c in self.classes.values() if c.priority > k.priority
            ),
        )
