"""The live tenant book: the one place the current `Tenants` is read from.

Every request reads ``router.tenants.current`` (the key check, rights, limits, the
core's terms); a reload (``SIGHUP``, ``POST /models/reload``) swaps in a new `Tenants`
whole, so a request sees one book or the other, never half of each.
"""

from __future__ import annotations

from troupe.settings.router import RouterSettings
from troupe.tenants.model import Tenants

__all__ = ["TenantBook", "book_for"]


class TenantBook:
    __slots__ = ("current",)

    def __init__(self, tenants: Tenants) -> None:
        self.current = tenants

    def replace(self, tenants: Tenants) -> None:
        self.current = tenants


def book_for(settings: RouterSettings) -> TenantBook:
    """The book for ``settings``: the keys from ``--api-key``/``--api-key-file``/
    ``--named-api-keys``, each an admin tenant of the default class."""
    return TenantBook(Tenants.from_keys(settings.api_keys, settings.api_key_names))
