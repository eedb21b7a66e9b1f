"""Carrying out the core's effects: children, replies, events, and handing the rest on.

Part of the scheduler actor (scheduler.py takes messages in; this acts). Nothing here
awaits inside a dispatch: children run in the actor's nursery, blocking work in worker
threads, and each reports back as a message. Memory work is `MemoryWork`'s, catalog
swaps and removals the `CatalogKeeper`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import trio

from troupe.actors.catalog import CatalogKeeper
from troupe.actors.events import EventBus
from troupe.actors.instance import Instance, LaunchSpec
from troupe.actors.replies import Replies
from troupe.actors.scheduler_memory import MemoryWork
from troupe.child.ledger import PidLedger
from troupe.child.prefetch import model_files, prefetch
from troupe.messages import Message
from troupe.modellog import about
from troupe.sched import (
    Effect,
    Emit,
    Grant,
    Prefetch,
    Reply,
    SampleMemory,
    SchedulerCore,
    Spawn,
    Stop,
)
from troupe.sched.cpu import CpuPlan
from troupe.sched.devices import GpuPlan
from troupe.sched.effects import CancelMeasure, DeleteFiles, Measure, Reloaded
from troupe.sched.events import MemoryWarning, SchedulerEvent

__all__ = ["ChildTransport", "EffectExecutor", "Listener", "Spawner"]

log = logging.getLogger("troupe.scheduler")

Listener = Callable[[SchedulerEvent], None]


class ChildTransport(Protocol):
    """The one transport to children (the relay's pool), told what becomes of them:
    started (on a port), stopping (nothing new sent but the KV save), gone (exited)."""

    def started(self, model: str, gen: int, port: int, connections: int) -> None: ...

    def forget(self, model: str, gen: int) -> None: ...

    def gone(self, model: str, gen: int) -> None: ...


class Spawner(Protocol):
    def launch_spec(
        self, model: str, cpu: CpuPlan | None = None, gpu: GpuPlan | None = None
    ) -> LaunchSpec: ...


class EffectExecutor:
    def __init__(
        self,
        core: SchedulerCore,
        spawner: Spawner,
        keeper: CatalogKeeper,
        memory: MemoryWork,
        replies: Replies,
        bus: EventBus,
        ledger: PidLedger | None,
        send: trio.MemorySendChannel[Message],
        transport: ChildTransport | None = None,
    ) -> None:
        self._core = core
        self._spawner = spawner
        self._keeper = keeper
        self._memory = memory
        self._replies = replies
        self.bus = bus
        self._ledger = ledger
        self._send = send
        # Told when a child starts (how many connections it takes) and when it is stopped
        # or exits (its idle connections close: one holds llama-server's exit ~110 ms).
        self._transport = transport
        self.instances: dict[str, Instance] = {}
        self._listeners: list[Listener] = []
        self._prefetch_limit = trio.CapacityLimiter(1)  # one file read ahead at a time
        self.nursery: trio.Nursery | None = None

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # ----- effects ---------------------------------------------------------------------

    def apply(self, effects: list[Effect], now: float) -> None:
        """Carry out ``effects`` in order, and those that carrying them out produces."""
        work = list(effects)
        while work:
            effect = work.pop(0)
            match effect:
                case Spawn():
                    work += self._spawn(effect, now)
                case Stop():
                    self._stop(effect)
                case Reply():
                    if not self._replies.answer(effect.to, effect.result) and isinstance(
                        effect.result, Grant
                    ):
                        # The asker is gone: a lease nobody will use must not stay counted.
                        work += self._core.release(effect.to, now)
                case SampleMemory():
                    work += self._memory.sample(effect, now)
                case Prefetch():
                    self._start_prefetch(effect.model)
                case Emit():
                    self.publish(effect.event)
                case Reloaded():
                    self._keeper.swap(effect)
                case Measure():
                    self._memory.start_measure(effect)
                case CancelMeasure():
                    self._memory.cancel_measure(effect.model)
                case DeleteFiles():
                    self._keeper.delete_then_rescan(effect.rid, effect.model)

    def publish(self, event: SchedulerEvent) -> None:
        """To every listener (counters, the model logs: each sees every event) and to the
        ``/models/sse`` streams (which drop a slow subscriber)."""
        if isinstance(event, MemoryWarning):
            about(log, event.model).warning("%s", event.warning)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not take the scheduler down
                log.exception("event listener %r failed", listener)
        self.bus.publish(event.to_json())

    # ----- children ----------------------------------------------------------------------

    def _spawn(self, effect: Spawn, now: float) -> list[Effect]:
        assert self.nursery is not None
        try:
            spec = self._spawner.launch_spec(effect.model, effect.cpu, effect.gpu)
        except Exception as exc:  # a model that cannot be rendered fails alone
            about(log, effect.model).exception("cannot prepare its child")
            return self._core.exited(
                effect.model, effect.gen, 1, now, expected=False, detail=f"cannot start: {exc}"
            )
        inst = Instance(spec, effect.gen, self._send.clone(), self._ledger)
        self.instances[effect.model] = inst
        self.nursery.start_soon(inst.run, effect.delay)
        return []

    def _stop(self, effect: Stop) -> None:
        inst = self.instances.get(effect.model)
        if inst is not None and inst.gen == effect.gen:
            about(log, effect.model).info("stopping (%s)", effect.cause)
            self.forget_child(effect.model, effect.gen)
            inst.stop(kill=effect.kill, keep=effect.save_slots)  # the core decided

    def child_started(self, model: str, gen: int, port: int, connections: int) -> None:
        if self._transport is None:
            return
        try:
            self._transport.started(model, gen, port, connections)
        except Exception:  # the transport's trouble must not take the scheduler down
            about(log, model).exception("telling the transport about the child failed")

    def child_gone(self, model: str, gen: int) -> None:
        inst = self.instances.get(model)
        if inst is not None and inst.gen == gen:
            del self.instances[model]
        if self._transport is None:
            return
        try:
            self._transport.gone(model, gen)  # its port may be the next child's
        except Exception:  # the transport's trouble must not take the scheduler down
            about(log, model).exception("dropping the connections to its child failed")

    def forget_child(self, model: str, gen: int) -> None:
        if self._transport is None:
            return
        try:
            self._transport.forget(model, gen)
        except Exception:  # the transport's trouble must not take the scheduler down
            about(log, model).exception("dropping the connections to its child failed")

    # ----- read-ahead --------------------------------------------------------------------

    def _start_prefetch(self, model: str) -> None:
        entry = self._keeper.current.catalog.get(model)
        if entry is None or entry.model_path is None or self.nursery is None:
            return
        files = model_files(entry.model_path, entry.mmproj_path)
        self.nursery.start_soon(self._prefetch, model, files)

    async def _prefetch(self, model: str, files: list[Path]) -> None:
        try:
            asked = await trio.to_thread.run_sync(
                prefetch, files, limiter=self._prefetch_limit, abandon_on_cancel=True
            )
        except Exception:  # a hint: its failure must not take the scheduler down
            about(log, model).exception("reading its files ahead failed")
            return
        if asked:
            about(log, model).debug("reading ahead %d MiB while it waits", asked >> 20)
