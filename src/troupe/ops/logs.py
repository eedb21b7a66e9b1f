"""Every model's log, kept across its children: a bounded ring per model and readers
that never hold the writer up.

A child's stderr lines arrive here from its instance actor (`ModelLogs.writer`), and a
line of troupe's own marks each load, stop and death (`ModelLogs.on_event`, a scheduler
listener), so a reader sees where one child ends and the next begins. A reader gets a
bounded buffer of its own: when it falls behind, its oldest unread lines are dropped
and it is told how many, rather than being cut off or slowing the writer.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from troupe.sched.events import (
    ChildExited,
    ModelStatusSet,
    SchedulerEvent,
    StatusChanged,
    StopRequested,
)
from troupe.sched.status import Status

__all__ = ["LogLine", "LogSubscription", "ModelLogs"]

RING_LINES = 1000  # per model
READER_BUFFER = 2000  # lines a reader may fall behind by before it loses the oldest


@attrs.frozen
class LogLine:
    seq: int  # increasing across all models: the order lines were written
    time: float  # Unix time
    model: str
    source: str  # "child" (its stderr) or "troupe" (what troupe saw or did)
    text: str

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class LogSubscription:
    """Lines of one model (or of all, ``model`` None) written since it was opened."""

    def __init__(self, model: str | None, buffer: int) -> None:
        self.model = model
        self._pending: collections.deque[LogLine] = collections.deque(maxlen=buffer)
        self._missed = 0
        self._wake = trio.Event()
        self._closed = False

    def offer(self, line: LogLine) -> None:
        if len(self._pending) == self._pending.maxlen:
            self._missed += 1
        self._pending.append(line)
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    async def receive(self) -> tuple[list[LogLine], int]:
        """The lines since the last call (waiting for at least one) and how many were
        dropped before this reader got to them. `trio.EndOfChannel` once closed."""
        while not self._pending and not self._closed:
            await self._wake.wait()
            self._wake = trio.Event()
        if not self._pending:
            raise trio.EndOfChannel
        lines = list(self._pending)
        self._pending.clear()
        missed, self._missed = self._missed, 0
        return lines, missed


class ModelLogs:
    def __init__(self, ring: int = RING_LINES, reader_buffer: int = READER_BUFFER) -> None:
        self._ring = ring
        self._reader_buffer = reader_buffer
        self._lines: dict[str, collections.deque[LogLine]] = {}
        self._subscribers: set[LogSubscription] = set()
        self._seq = itertools.count(1)
        self._closed = False

    def write(self, model: str, text: str, source: str = "child") -> None:
        """Keep one line (never blocks; call from the Trio thread)."""
        line = LogLine(next(self._seq), time.time(), model, source, text)
        ring = self._lines.get(model)
        if ring is None:
            ring = self._lines[model] = collections.deque(maxlen=self._ring)
        ring.append(line)
        for sub in self._subscribers:
            if sub.model is None or sub.model == model:
                sub.offer(line)

    def writer(self, model: str) -> Callable[[str], None]:
        """Where a child of ``model`` writes its stderr lines."""
        return lambda text: self.write(model, text)

    def recent(self, model: str | None = None, limit: int | None = None) -> list[LogLine]:
        """The last lines kept, oldest first; of every model, in write order, for None."""
        if model is not None:
            lines = list(self._lines.get(model, ()))
        else:
            lines = sorted(itertools.chain(*self._lines.values()), key=lambda ln: ln.seq)
        return lines if limit is None else lines[-limit:] if limit > 0 else []

    @contextmanager
    def subscribe(self, model: str | None = None) -> Iterator[LogSubscription]:
        sub = LogSubscription(model, self._reader_buffer)
        if self._closed:
            sub.close()
        else:
            self._subscribers.add(sub)
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)

    def close(self) -> None:
        """End every reader (the router is going down); lines are still kept."""
        self._closed = True
        for sub in list(self._subscribers):
            sub.close()
        self._subscribers.clear()

    # ----- the scheduler's events (Scheduler.add_listener) -------------------------------

    def on_event(self, event: SchedulerEvent) -> None:
        text = _describe(event)
        if text is not None:
            self.write(event.model, text, source="troupe")


def _describe(event: SchedulerEvent) -> str | None:
    match event:
        case ModelStatusSet(status=Status.LOADING):
            return "loading: starting a child"
        case StatusChanged(status=Status.LOADED):
            return "loaded: the child is ready"
        case StatusChanged(status=Status.SLEEPING):
            return "sleeping"
        case StopRequested(cause=cause) if cause.reason.is_eviction:
            return f"evicting ({cause.describe()})"
        case StopRequested(cause=cause):
            return f"stopping ({cause.describe()})"
        case ChildExited(exit_code=code, expected=True):
            return f"stopped (exit code {code})"
        case ChildExited(exit_code=code, oom=oom):
            why = ", out of memory" if oom else ""
            return f"the child died (exit code {code}{why})"
    return None
