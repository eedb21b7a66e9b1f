"""The KV store's Prometheus metrics (on the router's registry, beside troupe's own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["KvMetrics"]

_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)


class KvMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.saves = Counter(
            "troupe_kv_saves",
            "Slots saved (before a stop, or before another conversation takes the slot), "
            "by result: saved, failed, abandoned (over the time bound)",
            ["model", "result"],
            registry=reg,
        )
        self.restores = Counter(
            "troupe_kv_restores",
            "Stored entries restored into a child's slot, by result: restored, failed, "
            "corrupt (checksum or size wrong: dropped), ignored (the engine reused none of "
            "it: restores then stop for the model)",
            ["model", "result"],
            registry=reg,
        )
        self.lookups = Counter(
            "troupe_kv_lookups",
            "Requests that took a slot for their conversation while stored entries could "
            "match: hit (an entry restored into the slot) or miss",
            ["model", "result"],
            registry=reg,
        )
        self.bytes = Counter(
            "troupe_kv_bytes",
            "Slot bytes written to the store (saved) and read back (restored)",
            ["model", "direction"],
            registry=reg,
        )
        self.save_seconds = Histogram(
            "troupe_kv_save_seconds",
            "One slot's save: the engine's write and the checksum",
            ["model"],
            buckets=_SECONDS,
            registry=reg,
        )
        self.restore_seconds = Histogram(
            "troupe_kv_restore_seconds",
            "One restore before a request: match, checksum and the engine's read",
            ["model"],
            buckets=_SECONDS,
            registry=reg,
        )
        self.stored_bytes = Gauge(
            "troupe_kv_stored_bytes", "Bytes in the KV store, per model", ["model"], registry=reg
        )
        self.stored_entries = Gauge(
            "troupe_kv_stored_entries",
            "Entries in the KV store, per model",
            ["model"],
            registry=reg,
        )
