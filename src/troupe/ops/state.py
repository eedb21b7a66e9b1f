"""Gauges built at scrape time from the scheduler's snapshot and a fresh memory reading.

Memory, per device ("host", "cuda:0", ...):

* need: what loading a model takes (the estimate, or what it used last time);
* reserved: what the scheduler accounts to each model holding memory now (loading or
  loaded, not asleep), which is what admission subtracts from the free memory;
* observed: what each child process holds right now (its RSS on the host, NVML's
  figure on a GPU), read for this scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from troupe import __version__
from troupe.ops.live import LiveRate
from troupe.sched import Snapshot, Status
from troupe.sched.memory import MemorySample

__all__ = ["ScrapeState", "state_families"]


@attrs.frozen
class ScrapeState:
    snapshot: Snapshot
    margin: int | None  # --models-memory-margin in bytes; None: no memory admission
    swaps_per_minute: int
    sample: MemorySample | None  # None: the reading failed
    children_up: Mapping[str, bool]  # model -> its own /metrics answered
    live: Mapping[str, LiveRate] = attrs.field(factory=dict)  # model -> its streams now


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def state_families(state: ScrapeState) -> list[Metric]:
    snap = state.snapshot
    views = snap.models.values()
    info = _gauge("troupe_info", "troupe's version", ["version"])
    info.add_metric([__version__], 1)
    models_max = _gauge("troupe_models_max", "--models-max (0: no limit)")
    models_max.add_metric([], snap.models_max)
    running = _gauge("troupe_models_running", "Models with a child (loading, loaded, sleeping)")
    running.add_metric([], snap.running)
    status = _gauge("troupe_model_status", "1 for the model's current status", ["model", "status"])
    in_flight = _gauge("troupe_model_in_flight", "Requests being served", ["model"])
    waiting = _gauge("troupe_model_waiting", "Requests queued for the model", ["model"])
    last_load = _gauge("troupe_model_last_load_seconds", "Its last load, spawn to ready", ["model"])
    for view in views:
        for value in Status:
            status.add_metric([view.name, str(value)], 1 if view.status is value else 0)
        in_flight.add_metric([view.name], view.in_flight)
        waiting.add_metric([view.name], view.waiting)
        if view.last_load_seconds is not None:
            last_load.add_metric([view.name], view.last_load_seconds)
    depth = _gauge("troupe_queue_depth", "Requests waiting in the admission queue")
    depth.add_metric([], sum(waiters for _, waiters in snap.queue))
    swaps = _gauge(
        "troupe_swaps_per_minute", "Models stopped to make room for another, last 60 seconds"
    )
    swaps.add_metric([], state.swaps_per_minute)
    up = _gauge(
        "troupe_child_metrics_up", "1 when a running child answered its own /metrics", ["model"]
    )
    for model, ok in sorted(state.children_up.items()):
        up.add_metric([model], 1 if ok else 0)
    streams = _gauge(
        "troupe_model_streams", "Streamed answers of the model being relayed now", ["model"]
    )
    speed = _gauge(
        "troupe_model_stream_tokens_per_second",
        "Tokens per second of the model's streams being relayed now, together (each "
        "stream's text events since its first)",
        ["model"],
    )
    for model, rate in sorted(state.live.items()):
        streams.add_metric([model], rate.streams)
        speed.add_metric([model], rate.tokens_per_second)
    families: list[Metric] = [info, models_max, running, status, in_flight, waiting, last_load]
    families += [depth, swaps, up, streams, speed, *_memory_families(state)]
    return families


def _memory_families(state: ScrapeState) -> list[Metric]:
    snap = state.snapshot
    need = _gauge(
        "troupe_model_memory_need_bytes", "What loading the model takes", ["model", "device"]
    )
    reserved = _gauge(
        "troupe_model_memory_reserved_bytes",
        "What admission accounts to the model while it holds memory",
        ["model", "device"],
    )
    observed = _gauge(
        "troupe_model_memory_observed_bytes",
        "What the model's child process holds now",
        ["model", "device"],
    )
    reserved_total: dict[str, int] = {}
    for view in snap.models.values():
        for device, n in sorted((view.memory_need or {}).items()):
            need.add_metric([view.name, device], n)
        holds = view.status in (Status.LOADING, Status.LOADED)
        if holds and view.memory_reserved:
            for device, n in sorted(view.memory_reserved.items()):
                reserved.add_metric([view.name, device], n)
                reserved_total[device] = reserved_total.get(device, 0) + n
        footprint = state.sample.footprint.get(view.pid) if state.sample and view.pid else None
        if view.status.is_running and footprint:
            for device, n in sorted(footprint.items()):
                observed.add_metric([view.name, device], n)
    reserved_device = _gauge(
        "troupe_memory_reserved_bytes", "What admission accounts to running models", ["device"]
    )
    for device, n in sorted(reserved_total.items()):
        reserved_device.add_metric([device], n)
    total = _gauge("troupe_device_memory_total_bytes", "Device memory", ["device"])
    free = _gauge(
        "troupe_device_memory_free_bytes",
        "Free device memory (host: MemAvailable)",
        ["device"],
    )
    devices = state.sample.devices if state.sample and state.sample.devices else snap.devices
    for reading in devices:
        total.add_metric([reading.name], reading.total)
        free.add_metric([reading.name], reading.free)
    families: list[Metric] = [need, reserved, observed, reserved_device, total, free]
    if state.margin is not None:
        margin = _gauge("troupe_memory_margin_bytes", "Memory kept free on every device")
        margin.add_metric([], state.margin)
        families.append(margin)
    return families
