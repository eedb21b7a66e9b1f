"""troupe's Prometheus exposition (``GET /metrics``): its counters, the gauges built from
the scheduler's snapshot and a fresh memory reading, and the children's own metrics.

A node of a cluster labels every sample with its name (``node``), so the nodes'
expositions merge into one without a relabelling rule per scrape target."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable

import trio
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from troupe.actors.scheduler import Scheduler
from troupe.ops.children import merge_families, scrape_children
from troupe.ops.history import children_rss
from troupe.ops.live import LiveStreams
from troupe.ops.metrics import RouterMetrics
from troupe.ops.state import ScrapeState, state_families
from troupe.proxy.upstream import UpstreamPool
from troupe.sched.memory import MemorySample

__all__ = ["render_metrics"]

log = logging.getLogger("troupe.metrics")

NODE_LABEL = "node"


class _Families:
    """What `generate_latest` reads: a fixed list of families."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


async def _sample(scheduler: Scheduler, pids: list[int]) -> MemorySample | None:
    sampler = scheduler.sampler
    try:
        if sampler is None:  # memory admission off: what the children hold, from /proc
            return await trio.to_thread.run_sync(children_rss, pids)
        return await sampler.asample(pids)
    except Exception as exc:  # a failed reading leaves the memory gauges out, not the scrape
        log.warning("memory reading for /metrics failed: %s", exc)
        return None


def _labelled(families: Iterable[Metric], node: str) -> list[Metric]:
    """Copies of ``families`` whose every sample also carries ``node="<node>"``."""
    out = []
    for family in families:
        clone = copy.copy(family)
        clone.samples = [s._replace(labels={**s.labels, NODE_LABEL: node}) for s in family.samples]
        out.append(clone)
    return out


async def render_metrics(
    scheduler: Scheduler,
    metrics: RouterMetrics,
    pool: UpstreamPool,
    margin: int | None,
    node: str | None = None,
    live: LiveStreams | None = None,
) -> bytes:
    """The whole exposition; ``margin`` is ``--models-memory-margin`` (None: off);
    ``node``: a cluster node's name, on every sample; ``live``: the streams relayed now."""
    snap = scheduler.snapshot
    running = [v for v in snap.models.values() if v.status.is_running]
    ready = [v.name for v in running if v.status.is_ready_or_sleeping]
    sample = await _sample(scheduler, [v.pid for v in running if v.pid])
    children, up = await scrape_children(pool, ready)
    state = ScrapeState(
        snapshot=scheduler.snapshot,  # the freshest, after the awaits above
        margin=margin,
        swaps_per_minute=metrics.swaps_per_minute(scheduler.snapshot),
        sample=sample,
        children_up=up,
        live=live.rates() if live is not None else {},
    )
    rest = state_families(state) + merge_families(children)
    if node is not None:
        every = _labelled([*metrics.registry.collect(), *rest], node)
        return generate_latest(_Families(every))
    own = generate_latest(metrics.registry)
    return own + generate_latest(_Families(rest))
