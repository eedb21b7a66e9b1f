"""troupe's own Prometheus metrics: counters fed by the scheduler's events, gauges read
from its snapshot at scrape time.

Counters come from `Scheduler.add_listener` (every event, synchronously), never from a
bus subscription, which drops a slow subscriber and would lose counts. The relay and
the request path each make one call in (`observe_relay`, `queue_wait`), so both can
move with the HTTP front. Gauges are built per scrape from the published snapshot and
a fresh memory reading (`troupe.ops.state`), so they never go stale between events.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs
import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)

from troupe.api import PROXY_GET_PATHS, PROXY_POST_PATHS, strip_prefix
from troupe.ops.access import AccessRecord
from troupe.ops.request_metrics import FastHistogram, RequestMetricsCollector
from troupe.sched import Snapshot, Status
from troupe.sched.events import (
    ChildExited,
    ModelStatusSet,
    SchedulerEvent,
    StatusChanged,
    StopRequested,
)

__all__ = ["RouterMetrics", "route_label"]

# A counter's ``_created`` sample reads as a gauge family of its own to most scrapers
# and dashboards, and troupe's start time is in process_start_time_seconds already.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Loads take seconds to minutes; waits for a model as long; the first bucket catches
# the requests that found their model up.
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
# A request: a tokenize in a millisecond to a long generation in minutes.
REQUEST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
SPEED_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
OTHER_MODEL = "-"  # a request that named no model of the catalog (bounded labels)
SWAP_WINDOW = 60.0  # seconds: troupe_swaps_per_minute counts the swaps in this window
_KNOWN_ROUTES = PROXY_POST_PATHS | PROXY_GET_PATHS | {"/props", "/metrics", "/v1/stream"}
# The Ollama API's routes that reach a child (troupe.ollama), counted like the others.
_KNOWN_ROUTES |= {"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"}


@functools.lru_cache(maxsize=512)  # twice per request; paths are the API's, bounded
def route_label(path: str, prefix: str) -> str:
    """The proxied route, bounded: ``/slots/3`` is ``/slots/:id``, anything else ``other``."""
    route = strip_prefix(path, prefix) or path
    if route.startswith("/slots/"):
        return "/slots/:id"
    return route if route in _KNOWN_ROUTES else "other"


class RouterMetrics:
    """One router's counters (its own registry: several routers may share a process)."""

    def __init__(self, prefix: str = "", clock: Callable[[], float] = trio.current_time) -> None:
        self.prefix = prefix
        self._clock = clock
        self.registry = CollectorRegistry()
        reg = self.registry
        self.loads = Counter(
            "troupe_model_loads",
            "Loads by outcome: loaded, failed (the child died before ready), cancelled "
            "(stopped while loading)",
            ["model", "result"],
            registry=reg,
        )
        self.load_seconds = Histogram(
            "troupe_model_load_duration_seconds",
            "From spawn to ready, for loads that ended ready",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=reg,
        )
        self.evictions = Counter(
            "troupe_model_evictions",
            "Stops troupe decided on by itself, by reason: lru (the slot was needed), "
            "memory (the memory was), drain (swapped out for a starving model), ttl",
            ["model", "reason"],
            registry=reg,
        )
        self.stops = Counter(
            "troupe_model_stops",
            "Every stop of a child troupe asked for, by reason: the evictions' (lru, memory, "
            "drain, ttl), unload, reload (preset changed), dropped (from the catalog), "
            "remove (DELETE /models), shutdown",
            ["model", "reason"],
            registry=reg,
        )
        self.crashes = Counter(
            "troupe_model_crashes",
            "Child exits troupe did not ask for (out-of-memory deaths included)",
            ["model"],
            registry=reg,
        )
        self.ooms = Counter(
            "troupe_model_oom",
            "Child exits whose log said it ran out of memory",
            ["model"],
            registry=reg,
        )
        fast = RequestMetricsCollector(reg)  # observed per request: no locks
        self.queue_wait = fast.histogram(
            "troupe_queue_wait_seconds",
            "How long a request waited for its model, by outcome: granted, failed, cancelled",
            ["model", "outcome"],
            WAIT_BUCKETS,
        )
        self.requests = fast.counter(
            "troupe_proxied_requests",
            "Requests relayed to a child, by route and the status answered",
            ["route", "status"],
        )
        self.bytes = fast.counter(
            "troupe_relayed_bytes",
            "Bytes relayed: request bodies to children, response bodies to clients",
            ["route", "direction"],
        )
        self.request_seconds = fast.histogram(
            "troupe_request_duration_seconds",
            "Proxied requests from arrival to the last byte (waits included), by model, "
            "route and status",
            ["model", "route", "status"],
            REQUEST_BUCKETS,
        )
        self.ttft_seconds = fast.histogram(
            "troupe_request_first_token_seconds",
            "From arrival to a stream's first event (its first token), or a whole "
            "answer's first byte, by model, route and status",
            ["model", "route", "status"],
            TTFT_BUCKETS,
        )
        self.prompt_tokens = fast.counter(
            "troupe_prompt_tokens",
            "Prompt tokens the children reported (usage, timings), by model",
            ["model"],
        )
        self.completion_tokens = fast.counter(
            "troupe_completion_tokens",
            "Generated tokens the children reported, by model",
            ["model"],
        )
        self.speed = fast.histogram(
            "troupe_generation_tokens_per_second",
            "Generation speed per request, as the child timed it (predicted_per_second)",
            ["model"],
            SPEED_BUCKETS,
        )
        # Per tenant (a key's name; none without keys), to bill from and to see who waits.
        self.tenant_requests = fast.counter(
            "troupe_tenant_requests",
            "Proxied requests per tenant, by the status answered (429: refused by a limit)",
            ["tenant", "status"],
        )
        self.tenant_tokens = fast.counter(
            "troupe_tenant_tokens",
            "Tokens the children reported per tenant: direction in (prompt) or out (generated)",
            ["tenant", "direction"],
        )
        self.tenant_wait = fast.histogram(
            "troupe_tenant_queue_wait_seconds",
            "How long a tenant's requests waited for a slot or a load (refused ones not counted)",
            ["tenant"],
            WAIT_BUCKETS,
        )
        self.tenant_rejected = fast.counter(
            "troupe_tenant_rejected",
            "Requests refused by a tenant's limits, by reason: requests_per_minute, "
            "tokens_per_minute, tokens_per_day, in_flight (the day's budget is reserved by "
            "requests still running), too_large (more than a minute's tokens)",
            ["tenant", "reason"],
        )
        # A cluster node's forwards (troupe.http.cluster_forward): "to" the node it sent
        # the request to; outcome served, unreachable, hung, failed, cut.
        self.forwarded = fast.counter(
            "troupe_forwarded",
            "Requests this node forwarded to another node of its cluster, by that node and "
            "outcome: served (its answer relayed), unreachable (no connection: the next "
            "node tried), hung (no answer nor health check: the next node tried), failed "
            "(an error after the request was sent), cut (the node hung mid-answer)",
            ["to", "outcome"],
        )
        self.swaps = Counter(
            "troupe_swaps",
            "Models stopped to make room for another (rate() it; "
            "troupe_swaps_per_minute is the same, precomputed, kept for old dashboards)",
            registry=reg,
        )
        ProcessCollector(registry=reg)  # troupe's own CPU, memory and open fds
        self._loading: dict[str, float] = {}  # model -> when its load started
        self.up_since: dict[str, float] = {}  # model -> when its child became ready
        self.relayed_total = 0  # requests relayed, all routes (the dashboard's history)
        self._series: dict[tuple[str, str, int], _RequestSeries] = {}

    # ----- the scheduler's events (Scheduler.add_listener) -------------------------------

    def on_event(self, event: SchedulerEvent) -> None:
        """Count one scheduler event; quick, never blocks."""
        now = self._clock()
        match event:
            case ModelStatusSet(model=model, status=Status.LOADING):
                self._loading[model] = now
            case StatusChanged(model=model, status=Status.LOADED):
                started = self._loading.pop(model, None)
                if started is not None:  # a wake from sleep reports "loaded" too: not a load
                    self.up_since[model] = now
                    self.loads.labels(model, "loaded").inc()
                    self.load_seconds.labels(model).observe(max(0.0, now - started))
            case ChildExited(model=model):
                self.up_since.pop(model, None)
                if self._loading.pop(model, None) is not None:
                    self.loads.labels(model, "cancelled" if event.expected else "failed").inc()
                if not event.expected:
                    self.crashes.labels(model).inc()
                if event.oom:
                    self.ooms.labels(model).inc()
            case StopRequested(model=model, cause=cause):
                self.stops.labels(model, cause.reason.value).inc()
                if cause.reason.is_swap:
                    self.swaps.inc()
                if cause.reason.is_eviction:
                    self.evictions.labels(model, cause.reason.value).inc()
            case _:
                pass

    def swaps_per_minute(self, snapshot: Snapshot) -> int:
        """Models stopped to make room for another in the last minute (the scheduler's
        count, read as of now)."""
        return snapshot.swaps_since(self._clock() - SWAP_WINDOW)

    # ----- the request path --------------------------------------------------------------

    def observe_queue_wait(self, model: str, outcome: str, waited: float) -> None:
        """A request's wait for its model ended (granted, failed or cancelled:
        `troupe.lease.Lease`)."""
        self.queue_wait.child(model, outcome).observe(max(0.0, waited))

    def observe_forward(self, to: str, outcome: str) -> None:
        """One forward to cluster node ``to`` ended with ``outcome``."""
        self.forwarded.inc((to, outcome))

    def observe_rejected(self, tenant: str, reason: str) -> None:
        """A request refused by ``tenant``'s limits (`troupe.lease.Lease`)."""
        self.tenant_rejected.inc((tenant, reason))

    def observe_relay(
        self, path: str, status: int, request_bytes: int, response_bytes: int
    ) -> None:
        """One relayed request, as it ends: its status and the body bytes both ways."""
        route = route_label(path, self.prefix)
        self.relayed_total += 1
        self.requests.inc((route, str(status)))
        if request_bytes:
            self.bytes.inc((route, "request"), request_bytes)
        if response_bytes:
            self.bytes.inc((route, "response"), response_bytes)

    def observe_request(self, rec: AccessRecord) -> None:
        """One proxied request, as it ends (`troupe.ops.access.RequestLog`'s listener)."""
        model = rec.model if rec.catalogd else OTHER_MODEL
        key = (model, rec.route, rec.status)
        series = self._series.get(key)
        if series is None:  # the label set's histograms, found once
            status = str(rec.status)
            series = self._series[key] = _RequestSeries(
                self.request_seconds.child(model, rec.route, status),
                self.ttft_seconds.child(model, rec.route, status),
                self.speed.child(model),
            )
        series.duration.observe(rec.duration)
        first = rec.ttft if rec.ttft is not None else rec.ttfb
        if first is not None:
            series.first.observe(first)
        if rec.prompt_tokens:
            self.prompt_tokens.inc((model,), rec.prompt_tokens)
        if rec.completion_tokens:
            self.completion_tokens.inc((model,), rec.completion_tokens)
        if rec.tokens_per_second is not None:
            series.speed.observe(rec.tokens_per_second)
        if rec.tenant:
            self._observe_tenant(rec)

    def _observe_tenant(self, rec: AccessRecord) -> None:
        tenant = rec.tenant
        self.tenant_requests.inc((tenant, str(rec.status)))
        if rec.prompt_tokens:
            self.tenant_tokens.inc((tenant, "in"), rec.prompt_tokens)
        if rec.completion_tokens:
            self.tenant_tokens.inc((tenant, "out"), rec.completion_tokens)
        if rec.queue_wait is not None:
            self.tenant_wait.child(tenant).observe(rec.queue_wait + (rec.load_wait or 0.0))


@attrs.frozen
class _RequestSeries:
    """One label set's request histograms."""

    duration: FastHistogram
    first: FastHistogram
    speed: FastHistogram
