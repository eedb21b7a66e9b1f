"""Helpers for driving `SchedulerCore` by hand in the example tests.

`Bench` holds a core, a clock and fresh ports/pids, and plays the actor's part in
the small: it feeds one event, returns the effects, and offers one-liners for the
common lifecycles (bring a model up, let a Stop finish).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import attrs

from troupe.sched import (
    Effect,
    Emit,
    Failure,
    Grant,
    ModelConfig,
    Reply,
    SchedulerCore,
    Spawn,
    Status,
    Stop,
)

UPSTREAM_EVENTS = ("model_status", "status_change")


@attrs.frozen
class Sse:
    """An `Emit` as a ``/models/sse`` subscriber receives it (upstream's wire shape)."""

    model: str
    event: str
    data: dict[str, Any] | None = None


def sse(e: Emit) -> Sse:
    wire = e.event.to_json()
    assert set(wire) <= {"model", "event", "data"}, wire
    return Sse(wire["model"], wire["event"], wire.get("data"))


def is_troupe_extra(e: Effect) -> bool:
    """troupe's own effects beyond upstream's: its SSE events (``troupe_*``, reloads) and
    memory sampling. The example tests check upstream's behaviour and ignore these."""
    if isinstance(e, Emit):
        return sse(e).event not in UPSTREAM_EVENTS
    return not isinstance(e, Spawn | Stop | Reply)


def spawns(effects: Iterable[Effect]) -> list[Spawn]:
    return [e for e in effects if isinstance(e, Spawn)]


def stops(effects: Iterable[Effect]) -> list[Stop]:
    return [e for e in effects if isinstance(e, Stop)]


def replies(effects: Iterable[Effect]) -> list[Reply]:
    return [e for e in effects if isinstance(e, Reply)]


def emits(effects: Iterable[Effect]) -> list[Sse]:
    """The SSE events among ``effects``, as subscribers see them."""
    return [sse(e) for e in effects if isinstance(e, Emit)]


def reply_to(effects: Iterable[Effect], rid: int) -> Grant | Failure | None:
    """The one answer ``rid`` got in ``effects`` (fails if none or several)."""
    found = [r for r in replies(effects) if r.to == rid]
    assert len(found) == 1, f"expected exactly one reply to {rid}, got {found}"
    return found[0].result


def answered(effects: Iterable[Effect]) -> set[int]:
    return {r.to for r in replies(effects)}


def grant_of(effects: Iterable[Effect], rid: int) -> Grant:
    result = reply_to(effects, rid)
    assert isinstance(result, Grant), result
    return result


def failure_of(effects: Iterable[Effect], rid: int) -> Failure:
    result = reply_to(effects, rid)
    assert isinstance(result, Failure), result
    return result


class Bench:
    """A core plus the bookkeeping an actor would keep (clock, ports, pids)."""

    def __init__(
        self,
        models: Iterable[str | ModelConfig] = ("a", "b", "c"),
        models_max: int = 0,
        **kwargs: Any,
    ) -> None:
        configs = [m if isinstance(m, ModelConfig) else ModelConfig(m) for m in models]
        self.core = SchedulerCore(configs, models_max, **kwargs)
        self.now = 0.0
        self._rids = itertools.count(1)
        self._ports = itertools.count(40001)
        self.gen: dict[str, int] = {}  # last Spawn seen per model
        self.extra: list[Effect] = []  # troupe's own effects from the last event
        self.port: dict[str, int] = {}

    # ----- bookkeeping ------------------------------------------------------------------

    def rid(self) -> int:
        return next(self._rids)

    def tick(self, dt: float = 1.0) -> float:
        self.now += dt
        return self.now

    def _seen(self, effects: list[Effect]) -> list[Effect]:
        """Record spawns; set troupe's own events aside (`self.extra`) so that tests see
        what upstream would do: Spawn, Stop, Reply and upstream's SSE events."""
        for s in spawns(effects):
            self.gen[s.model] = s.gen
        self.extra = [e for e in effects if is_troupe_extra(e)]
        return [e for e in effects if not is_troupe_extra(e)]

    def status(self, model: str) -> Status:
        return self.core.snapshot().models[model].status

    def view(self, model: str) -> Any:
        return self.core.snapshot().models[model]

    # ----- events (time advances one second before each) ---------------------------------

    def acquire(self, rid: int, model: str, **kw: Any) -> list[Effect]:
        return self._seen(self.core.acquire(rid, model, self.tick(), **kw))

    def release(self, rid: int) -> list[Effect]:
        return self._seen(self.core.release(rid, self.tick()))

    def load(self, rid: int, model: str) -> list[Effect]:
        return self._seen(self.core.load(rid, model, self.tick()))

    def unload(self, rid: int, model: str) -> list[Effect]:
        return self._seen(self.core.unload(rid, model, self.tick()))

    def stop_all(self, rid: int) -> list[Effect]:
        return self._seen(self.core.stop_all(rid, self.tick()))

    def spawned(self, model: str, gen: int | None = None) -> list[Effect]:
        gen = self.gen[model] if gen is None else gen
        port = next(self._ports)
        self.port[model] = port
        return self._seen(self.core.spawned(model, gen, port, port + 10000, self.tick()))

    def state(
        self, model: str, state: str, payload: Any = None, gen: int | None = None
    ) -> list[Effect]:
        gen = self.gen[model] if gen is None else gen
        return self._seen(self.core.child_state(model, gen, state, payload, self.tick()))

    def ready(self, model: str, payload: Any = None, gen: int | None = None) -> list[Effect]:
        return self.state(model, "ready", {"id": model} if payload is None else payload, gen)

    def exited(
        self,
        model: str,
        code: int = 0,
        *,
        expected: bool = True,
        gen: int | None = None,
        detail: str | None = None,
    ) -> list[Effect]:
        gen = self.gen[model] if gen is None else gen
        return self._seen(
            self.core.exited(model, gen, code, self.tick(), expected=expected, detail=detail)
        )

    def on_time(self, now: float) -> list[Effect]:
        self.now = now
        return self._seen(self.core.on_time(now))

    # ----- lifecycles -----------------------------------------------------------------------

    def bring_up(self, model: str) -> int:
        """Load ``model`` through ``POST /models/load`` until it is ``loaded``; returns gen."""
        rid = self.rid()
        out = self.load(rid, model)
        assert reply_to(out, rid) is None, out
        assert [s.model for s in spawns(out)] == [model], out
        self.spawned(model)
        self.ready(model)
        assert self.status(model) is Status.LOADED
        return self.gen[model]

    def lease(self, model: str) -> int:
        """Take a lease on a ready model; returns its rid."""
        rid = self.rid()
        grant_of(self.acquire(rid, model), rid)
        return rid

    def finish_stop(self, stop: Stop) -> list[Effect]:
        """The actor's stop ladder ends: a killed child reports 1, a graceful one 0."""
        return self.exited(stop.model, 1 if stop.kill else 0, gen=stop.gen)
