"""Whose request it is: the API key's tenant, read from the live tenant book.

The key itself is checked by `Front.admit` (and the realtime handshake) against
``router.tenants.current`` (`troupe.tenants.model.Tenants.match`: every key compared
in constant time, every time); ``request.key_name`` is then the name of the tenant
whose key it was ("" where no key is needed).

With several keys, or a tenants file, each key is a tenant (`tenant_of`): its
conversations, streams and access records are its own, and another key meets them as
ids that do not exist; what a tenant may see of the others' records is `viewer_of`
(an admin from a tenants file sees everyone's). With one key (or none) there is one
tenant, "", and everyone sees everything, as upstream.
"""

from __future__ import annotations

from troupe.tenants.model import Tenants

__all__ = ["tenant_of", "viewer_of"]


def tenant_of(tenants: Tenants, key_name: str) -> str:
    """The tenant of a request that carried the key named ``key_name``: that name when
    tenants are kept apart (several, or a tenants file), else "" (one tenant: every
    record is everyone's)."""
    return tenants.owner(key_name)


def viewer_of(tenants: Tenants, key_name: str) -> str:
    """Whose records the request may see ("" is everyone's): its own tenant's when
    tenants are kept apart, unless the tenants file makes it admin."""
    return tenants.viewer(key_name)
