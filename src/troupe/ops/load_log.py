"""The log's account of loads: when a request starts one, why requests wait, how far a
long load has got, and "ready in N s". One line per load or change of reason, never
one per request (a scheduler listener, `troupe.actors.scheduler.Scheduler.add_listener`).

The core announces a load (`ModelStatusSet` loading) before it reports the queue that
asked for it (`QueueChanged`, at the end of the same step): the start is logged with the
queue's count once that comes, or with the count already known.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

import attrs

from troupe.modellog import about
from troupe.sched.events import (
    ChildExited,
    ModelStatusSet,
    QueueChanged,
    SchedulerEvent,
    StatusChanged,
)
from troupe.sched.status import Status
from troupe.sched.verdicts import LOADING

__all__ = ["LoadLog", "load_percent"]

log = logging.getLogger("troupe.load")

PROGRESS_AFTER = 5.0  # seconds: a load this long gets a progress line ...
PROGRESS_EVERY = 5.0  # ... and one more at most this often


def load_percent(progress: object) -> int | None:
    """The engine's staged progress (``{"stages": [...], "current": ..., "value": 0..1}``)
    as one percentage over all stages; None when it says none."""
    if not isinstance(progress, Mapping):
        return None
    value = progress.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    value = min(1.0, max(0.0, float(value)))
    stages, current = progress.get("stages"), progress.get("current")
    if isinstance(stages, list) and len(stages) > 1 and current in stages:
        value = (stages.index(current) + value) / len(stages)
    return int(value * 100)


@attrs.define
class _Load:
    started: float
    announced: bool = False  # its start is logged
    said: float = 0.0  # when its last progress line was logged


class LoadLog:
    """``clock``: seconds (the scheduler's time base does not matter, only differences)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._loads: dict[str, _Load] = {}
        self._waiting: dict[str, int] = {}
        self._reason: dict[str, str | None] = {}

    def on_event(self, event: SchedulerEvent) -> None:
        match event:
            case ModelStatusSet(model=model, status=Status.LOADING):
                load = self._loads[model] = _Load(self._clock())
                if self._waiting.get(model):
                    self._announce(model, load)
            case QueueChanged(model=model, waiting=waiting, reason=reason):
                self._queue(model, waiting, reason)
            case StatusChanged(model=model, status=Status.LOADING, progress=progress):
                self._progress(model, progress)
            case StatusChanged(model=model, status=Status.LOADED):
                ended = self._loads.pop(model, None)
                if ended is not None:
                    self._announce(model, ended)
                    took = self._clock() - ended.started
                    about(log, model).info("ready in %.1f s", took)
            case ChildExited(model=model):
                self._loads.pop(model, None)

    def _announce(self, model: str, load: _Load) -> None:
        if load.announced:
            return
        load.announced = True
        waiting = self._waiting.get(model, 0)
        if waiting:
            about(log, model).info("a request starts its load (%d waiting)", waiting)
        else:
            about(log, model).info("loading (no request waiting: a load asked for)")

    def _queue(self, model: str, waiting: int, reason: str | None) -> None:
        self._waiting[model] = waiting
        load = self._loads.get(model)
        if load is not None:
            self._announce(model, load)
        if not waiting:
            self._reason.pop(model, None)
            return
        if reason and reason != LOADING and reason != self._reason.get(model):
            about(log, model).info("%d request(s) wait: %s", waiting, reason)
        self._reason[model] = reason

    def _progress(self, model: str, progress: object) -> None:
        load = self._loads.get(model)
        if load is None:
            return
        self._announce(model, load)
        now = self._clock()
        if now - load.started < PROGRESS_AFTER or now - load.said < PROGRESS_EVERY:
            return
        percent = load_percent(progress)
        if percent is not None:
            load.said = now
            took = now - load.started
            about(log, model).info("loading: %d%% after %.0f s", percent, took)
