"""Why a child is stopped, as a typed value from the core to the edge.

Metrics count stops by `StopReason` (a bounded label set), the log and ``/models``
show `StopCause.describe` (which names the model a swap made room for), and the core
decides by the reason's kind, never by matching text.
"""

from __future__ import annotations

import enum

import attrs

__all__ = ["StopCause", "StopReason"]


class StopReason(enum.StrEnum):
    LRU = "lru"  # its slot was needed by a queued model
    MEMORY = "memory"  # its memory was needed by a model that would not fit
    DRAIN = "drain"  # swapped out for a model that starved while it stayed busy
    TTL = "ttl"  # idle longer than its ttl
    KEEP_ALIVE = "keep_alive"  # idle longer than a client's keep_alive asked (0: Ollama's eject)
    REPLAN = "replan"  # started again on a narrower CPU lane, beside a model that needs one
    UNLOAD = "unload"  # POST /models/unload
    RELOAD = "reload"  # a reload changed its preset
    DROPPED = "dropped"  # a reload dropped it from the catalog
    REMOVE = "remove"  # DELETE /models
    SHUTDOWN = "shutdown"

    @property
    def is_eviction(self) -> bool:
        """A stop troupe decided on by itself (not asked for by a client or operator)."""
        return self in _EVICTIONS

    @property
    def saves_slots(self) -> bool:
        """Whether the child's KV slots are saved before it stops: not for a model whose
        files or preset are going away (a removal, a reload that drops or changes it)."""
        return self not in _NOT_KEPT

    @property
    def is_swap(self) -> bool:
        """A stop that makes room for another model (counted in swaps per minute)."""
        return self in _SWAPS


_SWAPS = frozenset({StopReason.LRU, StopReason.MEMORY, StopReason.DRAIN})
_FOR = _SWAPS | {StopReason.REPLAN}  # reasons that name the model they are for
_EVICTIONS = _SWAPS | {StopReason.TTL, StopReason.REPLAN}
_NOT_KEPT = frozenset({StopReason.REMOVE, StopReason.DROPPED, StopReason.RELOAD})
# The words upstream-compatible readers have always seen (``last_eviction``).
_WORDS = {
    StopReason.TTL: "ttl",
    StopReason.KEEP_ALIVE: "unload asked by a client (keep_alive)",
    StopReason.UNLOAD: "unload request",
    StopReason.RELOAD: "preset changed",
    StopReason.DROPPED: "removed from the catalog",
    StopReason.REMOVE: "removed",
    StopReason.SHUTDOWN: "shutdown",
}


@attrs.frozen
class StopCause:
    """A reason, and for a swap the model it makes room for."""

    reason: StopReason
    for_model: str | None = None

    def describe(self) -> str:
        """In words, for logs and ``/models``: ``lru for b``, ``ttl``, ``unload request``."""
        if self.reason in _FOR and self.for_model is not None:
            return f"{self.reason.value} for {self.for_model}"
        if self.reason is StopReason.REPLAN:
            return "replan (a wider lane)"
        return _WORDS[self.reason]

    def __str__(self) -> str:
        return self.describe()
