"""The KV store: a child's slots saved before troupe stops it, restored when they return.

`KvStore` holds the files (``--state-dir``/kv, one directory per KV identity),
`KvService` is what the launcher, the instance's stop and the request path call.
"""

from troupe.kvstore.identity import kv_identity
from troupe.kvstore.service import (
    Hold,
    KvService,
    cached_held,
    cached_in,
    tokens_held,
    tokens_in,
)
from troupe.kvstore.store import KvEntry, KvStore

__all__ = [
    "Hold",
    "KvEntry",
    "KvService",
    "KvStore",
    "cached_held",
    "cached_in",
    "kv_identity",
    "tokens_held",
    "tokens_in",
]
