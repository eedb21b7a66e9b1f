"""A short window of the dashboard's samples, kept by the server so a page that opens
(or reloads) draws its charts with the last minutes at once instead of starting empty.

Every `HISTORY_EVERY` seconds: memory used per device (total minus free, a fresh
reading when memory admission reads devices, else the scheduler's last), the proxied
requests so far (the page turns two into a rate) and the requests in flight.
``GET /troupe/history`` serves the window.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import attrs
import trio

from troupe.actors.scheduler import Scheduler
from troupe.ops.metrics import RouterMetrics
from troupe.sched.memory import MemorySample

__all__ = ["HISTORY_EVERY", "History"]

log = logging.getLogger("troupe.history")

HISTORY_EVERY = 2.0  # seconds between samples, as the page polls /metrics
HISTORY_POINTS = 150  # five minutes


@attrs.frozen
class Point:
    time: float  # epoch seconds
    memory_used: dict[str, int]  # device -> bytes in use
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

    async def _reading(self, scheduler: Scheduler) -> MemorySample | None:
        if scheduler.sampler is None:
            return None
        try:
            return await scheduler.sampler.asample([])
        except Exception as exc:  # a failed reading leaves the point without memory
            log.debug("memory reading for the history failed: %s", exc)
            return None

    async def sample(self, scheduler: Scheduler, metrics: RouterMetrics) -> None:
        sample = await self._reading(scheduler)
        snap = scheduler.snapshot
        devices = sample.devices if sample is not None else snap.devices
        self._points.append(
            Point(
                time=time.time(),
                memory_used={d.name: d.total - d.free for d in devices},
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
