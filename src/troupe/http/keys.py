"""API keys: compared in constant time, each with a name for logs (never the key).

Every configured key is compared with `hmac.compare_digest`, all of them every time,
so neither which key matched nor how much of a guess was right shows in the timing.
Keys from ``--api-key`` and ``--api-key-file`` are named ``key-1``, ``key-2``, ... in
order; ``--named-api-keys FILE`` gives each its own (lines ``name:key``).

With several keys, each key is a tenant (`tenant_of`): its conversations, streams and
access records are its own, and another key meets them as ids that do not exist. With
one key (or none) there is one tenant, "", and everyone sees everything, as upstream.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Sequence

from troupe.settings.router import RouterSettings

__all__ = ["KeyRing", "ring_for", "tenant_of"]


class KeyRing:
    def __init__(self, keys: Sequence[str], names: Sequence[str] = ()) -> None:
        self._keys = [
            (key.encode("utf-8"), names[i] if i < len(names) and names[i] else f"key-{i + 1}")
            for i, key in enumerate(keys)
        ]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, given: str) -> str | None:
        """The name of the key ``given`` is, or None."""
        raw = given.encode("utf-8", "surrogateescape")
        found: str | None = None
        for key, name in self._keys:
            if hmac.compare_digest(key, raw) and found is None:
                found = name
        return found


@functools.lru_cache(maxsize=8)
def _ring(keys: tuple[str, ...], names: tuple[str, ...]) -> KeyRing:
    return KeyRing(keys, names)


def ring_for(settings: RouterSettings) -> KeyRing:
    """The settings' keys (built once per set of keys)."""
    return _ring(settings.api_keys, settings.api_key_names)


def tenant_of(settings: RouterSettings, key_name: str) -> str:
    """The tenant of a request that carried the key named ``key_name``: that name when
    several keys are configured, else "" (one tenant: every record is everyone's)."""
    return key_name if len(settings.api_keys) > 1 else ""
