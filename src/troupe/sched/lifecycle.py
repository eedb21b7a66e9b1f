"""Lifecycle events of the whole table: shutdown (stop_all, drain), reload, removal.

Each is one message that the core carries out to the end whatever the asker does
afterwards: a reload waits for the models it stops, a removal for its child.
"""

from __future__ import annotations

from collections.abc import Iterable

from troupe.sched.base import PendingReload
from troupe.sched.effects import CancelMeasure, Effect, Failure
from troupe.sched.settle import Settling
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig

__all__ = ["Lifecycle"]


class Lifecycle(Settling):
    def _close(self) -> None:
        """Shutting down: no new lease or load, and everyone waiting is answered."""
        self._closing = True
        for wid, w in list(self._waiters.items()):
            if w.queued:
                self._queue.leave(w.model)
            del self._waiters[wid]
            self._reply(wid, Failure.unavailable("server is shutting down"))
        for did in list(self._direct):
            del self._direct[did]
            self._reply(did, Failure.unavailable("server is shutting down"))

    def stop_all(self, rid: int, now: float) -> list[Effect]:
        """Shutdown: fail every waiter, stop every child, answer when none runs."""
        self._close()
        for m in self._models.values():
            self._request_stop(m, "shutdown")
        self._cancel_measurements()
        self._stop_all.append(rid)
        self._settle(now)
        return self._flush()

    def drain(self, now: float) -> list[Effect]:
        """Shutdown begins: requests holding a lease finish, nothing else starts. Every
        waiter and parked load is answered at once, and loads under way are killed (no
        one waits for them); loaded children stay up until `stop_all`."""
        self._close()
        for m in self._models.values():
            m.respawn_after_evictions = False
            if m.status is Status.LOADING or m.spawn_pending:
                self._request_stop(m, "shutdown")
        self._cancel_measurements()
        self._settle(now)
        return self._flush()

    def _cancel_measurements(self) -> None:
        if self._measure is not None:
            self._measure.todo.clear()
            if self._measure.running is not None:
                self._out.append(CancelMeasure(self._measure.running[0]))
                self._measure.running = None

    def reload(
        self, rid: int, restart: Iterable[str], models: Iterable[ModelConfig], now: float
    ) -> list[Effect]:
        """A reload (§6.9): loads wait, the running models in ``restart`` (preset changed
        or gone) are stopped, and once none of them runs ``models`` becomes the table and
        ``rid`` is answered. A reload asked for meanwhile is folded in: its catalogue,
        read later, wins, and both are answered together."""
        names = set(restart)
        if self._reload is None:
            self._reload = PendingReload(rid, [rid], names, tuple(models))
        else:
            self._reload.rid = rid
            self._reload.rids.append(rid)
            self._reload.restart |= names
            self._reload.models = tuple(models)
        for name in sorted(names):
            m = self._models.get(name)
            if m is not None:
                self._request_stop(m, "preset changed")
        self._settle(now)
        return self._flush()

    def remove(self, rid: int, model: str, now: float) -> list[Effect]:
        """``DELETE /models`` (§8): stop ``model``, then have its files deleted. From now on
        requests for it fail as for an unknown model; the reload after the deletion
        brings back whatever is left of it."""
        m = self._models.get(model)
        if m is None or m.removed:
            self._reply(rid, Failure.server_error(f"model name={model} is not found"))
            return self._flush()
        m.removed = True
        self._request_stop(m, "removed")
        self._removals[rid] = model
        self._settle(now)
        return self._flush()
