"""The live tenant book: the one place the current `Tenants` is read from.

Every request reads ``router.tenants.current`` (the key check, rights, limits, the
core's terms); a reload (``SIGHUP``, ``POST /models/reload``) swaps in a new `Tenants`
whole, so a request sees one book or the other, never half of each. A tenants file
that cannot be read on a reload leaves the book as it was (`TenantBook.reload`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from functools import partial

from troupe.settings.router import RouterSettings
from troupe.tenants.file import TenantsFileError, read_tenants
from troupe.tenants.model import Tenants

__all__ = ["TenantBook", "book_for"]

log = logging.getLogger("troupe.tenants")


class TenantBook:
    __slots__ = ("_read", "current")

    def __init__(self, tenants: Tenants, read: Callable[[], Tenants] | None = None) -> None:
        self.current = tenants
        self._read = read  # reads the tenants file again (None: no file, nothing to reload)

    def replace(self, tenants: Tenants) -> None:
        self.current = tenants

    def reload(self) -> str | None:
        """Read the tenants file again and put it in effect; None when it is (or there is
        no file), else why the book was kept as it was (logged, one line)."""
        if self._read is None:
            return None
        try:
            tenants = self._read()
        except TenantsFileError as exc:
            log.warning("tenants file kept as it was: %s", exc)
            return str(exc)
        self.current = tenants
        log.info("tenants file read again: %d tenants", len(tenants))
        return None


def book_for(settings: RouterSettings, environ: Mapping[str, str] | None = None) -> TenantBook:
    """The book for ``settings``: the tenants file (``--tenants``) with the keys from
    ``--api-key``/``--api-key-file``/``--named-api-keys`` as admin tenants beside it, or
    those keys alone. Raises `TenantsFileError` (one line) for a file that cannot be used."""
    if settings.tenants_file is None:
        return TenantBook(Tenants.from_keys(settings.api_keys, settings.api_key_names))
    env = dict(os.environ if environ is None else environ)
    read = partial(
        read_tenants, settings.tenants_file, env, settings.api_keys, settings.api_key_names
    )
    return TenantBook(read(), read)
