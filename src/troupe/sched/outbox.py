"""Where the core's effects collect while it handles one event."""

from __future__ import annotations

from troupe.sched.effects import Effect, Emit, Failure, Grant, Reply
from troupe.sched.events import SchedulerEvent

__all__ = ["Outbox"]


class Outbox:
    def __init__(self) -> None:
        self._effects: list[Effect] = []

    def add(self, effect: Effect) -> None:
        self._effects.append(effect)

    def reply(self, rid: int, result: Grant | Failure | None) -> None:
        self._effects.append(Reply(rid, result))

    def emit(self, event: SchedulerEvent) -> None:
        self._effects.append(Emit(event))

    def take(self) -> list[Effect]:
        """Everything collected since the last call, in order."""
        out, self._effects = self._effects, []
        return out
