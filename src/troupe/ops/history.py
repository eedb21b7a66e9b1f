"""A short window of the dashboard's samples, kept by the server so a page that opens
(or reloads) draws its charts with the last minutes at once instead of starting empty.

Every `HISTORY_EVERY` seconds: what each model's child holds (its RSS on the host, read
from /proc, and what NVML says it holds on each GPU), memory used per device (total
minus free, the whole machine's: other programs included), the proxied requests so far
(the page turns two into a rate) and the requests in flight.
``GET /troupe/history`` serves the window.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import attrs
import psutil
import trio

from troupe.actors.scheduler import Scheduler
from troupe.ops.metrics import RouterMetrics
from troupe.sched.devices import HOST
from troupe.sched.memory import MemorySample

__all__ = ["HISTORY_EVERY", "History", "children_rss"]

log = logging.getLogger("troupe.history")

HISTORY_EVERY = 2.0  # seconds between samples, as the page polls /metrics
HISTORY_POINTS = 150  # five minutes


@attrs.frozen
class Point:
    time: float  # epoch seconds
    memory_used: dict[str, int]  # device -> bytes in use (the whole machine's)
    models: dict[str, dict[str, int]]  # model -> device -> bytes its child holds
    requests: int  # proxied requests so far
    in_flight: int

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class History:
    def __init__(self, size: int = HISTORY_POINTS) -> None:
        self._points: collections.deque[Point] = collections.deque(maxlen=size)
        self._added = trio.Event()

    def points(self) -> list[Point]:
        return list(self._points)

    async def wait_for(self, count: int) -> None:
        """Until the window holds ``count`` points (tests)."""
        while len(self._points) < count:
            await self._added.wait()

    async def _reading(self, scheduler: Scheduler, pids: list[int]) -> MemorySample | None:
        try:
            if scheduler.sampler is None:  # memory admission off: the children's RSS alone
                return await trio.to_thread.run_sync(children_rss, pids)
            return await scheduler.sampler.asample(pids)
        except Exception as exc:  # a failed reading leaves the point without memory
            log.debug("memory reading for the history failed: %s", exc)
            return None

    async def sample(self, scheduler: Scheduler, metrics: RouterMetrics) -> None:
        children = {
            v.pid: v.name
            for v in scheduler.snapshot.models.values()
            if v.status.is_running and v.pid
        }
        sample = await self._reading(scheduler, list(children))
        snap = scheduler.snapshot
        devices = sample.devices if sample is not None and sample.devices else snap.devices
        held = sample.footprint if sample is not None else {}
        self._points.append(
            Point(
                time=time.time(),
                memory_used={d.name: d.total - d.free for d in devices},
                models={name: dict(held[pid]) for pid, name in children.items() if pid in held},
                requests=metrics.relayed_total,
                in_flight=sum(v.in_flight for v in snap.models.values()),
            )
        )
        self._added.set()
        self._added = trio.Event()

    async def run(self, scheduler: Scheduler, metrics: RouterMetrics) -> None:
        while True:
            await self.sample(scheduler, metrics)
            await trio.sleep(HISTORY_EVERY)


def children_rss(pids: list[int]) -> MemorySample:
    """The children's RSS from /proc, without a device reading (memory admission off)."""
    footprint: dict[int, dict[str, int]] = {}
    for pid in pids:
        try:
            footprint[pid] = {HOST: psutil.Process(pid).memory_info().rss}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return MemorySample((), footprint=footprint)
