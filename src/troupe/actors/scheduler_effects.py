"""Carrying out the core's effects: children, replies, memory readings, catalogue swaps.

The half of the scheduler actor that acts (the other half, scheduler.py, takes
messages in). Work that blocks (a scan of the model sources, deleting files, a memory
reading, saving observations) runs in the actor's own nursery, in worker threads,
and reports back as a message; nothing here awaits inside a dispatch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import trio

from troupe.actors.events import EventBus
from troupe.actors.instance import Instance, LaunchSpec
from troupe.actors.measure import MeasureJob
from troupe.actors.memory import MemorySampler
from troupe.catalog import needs_restart
from troupe.catalog.prepared import PreparedCatalog
from troupe.child.ledger import PidLedger
from troupe.child.prefetch import model_files, prefetch
from troupe.errors import ConfigError
from troupe.messages import (
    MeasureFailed,
    MemorySampled,
    MemorySampleFailed,
    Message,
    ReplyChannel,
    Rescanned,
)
from troupe.sched import (
    Effect,
    Emit,
    Failure,
    Grant,
    Prefetch,
    Reply,
    SampleMemory,
    SchedulerCore,
    Spawn,
    Stop,
)
from troupe.sched.effects import CancelMeasure, DeleteFiles, Measure, Reloaded

__all__ = ["ChildTransport", "EffectRunner", "Launcher"]

log = logging.getLogger("troupe.scheduler")


class ChildTransport(Protocol):
    """The one transport to children (the relay's pool), told what becomes of them."""

    def set_limit(self, model: str, gen: int, connections: int) -> None: ...

    def forget(self, model: str, gen: int) -> None: ...


class Launcher(Protocol):
    """What the scheduler needs from the rest of the program (the composition root).

    `scan`, `remove_files` and `remember_memory` block; they are called in worker
    threads, one at a time each."""

    def launch_spec(self, model: str) -> LaunchSpec: ...

    def measure_command(self, model: str) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of ``model``'s child, for a measurement."""

    def scan(self) -> PreparedCatalog:
        """Read every model source again (ConfigError when one is broken)."""

    def remove_files(self, model: str) -> bool:
        """Delete ``model``'s cache files; False when nothing was removed."""

    def remember_memory(self, model: str, used: Mapping[str, int]) -> None:
        """What ``model`` was seen to hold once up (kept for the next estimate)."""


class EffectRunner:
    _log = log

    def __init__(
        self,
        core: SchedulerCore,
        launcher: Launcher,
        catalogue: PreparedCatalog,
        bus: EventBus,
        ledger: PidLedger | None,
        sampler: MemorySampler | None,
        send: trio.MemorySendChannel[Message],
        transport: ChildTransport | None = None,
    ) -> None:
        self._core = core
        self._launcher = launcher
        self._catalogue = catalogue
        self.bus = bus
        self._ledger = ledger
        self._sampler = sampler
        self._send = send
        self._replies: dict[int, ReplyChannel] = {}
        self._instances: dict[str, Instance] = {}
        self._measures: dict[str, MeasureJob] = {}  # model -> its running measurement
        self._nursery: trio.Nursery | None = None
        self._remembered: dict[str, Mapping[str, int]] = {}
        self._scanned: dict[int, PreparedCatalog] = {}  # reloads the core has not done yet
        self._removing: dict[int, str] = {}  # removal rid -> model, announced after reload
        # Blocking work, one call at a time per kind (file writes must not interleave).
        self._scan_limit = trio.CapacityLimiter(1)
        self._save_limit = trio.CapacityLimiter(1)
        self._prefetch_limit = trio.CapacityLimiter(1)  # one file read ahead at a time
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        # Told when a child starts (how many connections it takes) and when it is stopped
        # or exits (its idle connections close: one holds llama-server's exit ~110 ms).
        self._transport = transport

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener`` with every event as it is emitted, inside the scheduler (for
        counters, which must see every event; the SSE bus drops slow subscribers). It
        must be quick and never block; an exception it raises is logged and ignored."""
        self._listeners.append(listener)

    @property
    def catalogue(self) -> PreparedCatalog:
        """The catalogue the model table was built from; replaced whole on reload."""
        return self._catalogue

    def instance(self, model: str) -> Instance | None:
        return self._instances.get(model)

    # ----- effects ---------------------------------------------------------------------

    def _apply(self, effects: list[Effect], now: float) -> None:
        work = list(effects)
        while work:
            effect = work.pop(0)
            match effect:
                case Spawn():
                    work += self._spawn(effect, now)
                case Stop():
                    inst = self._instances.get(effect.model)
                    if inst is not None and inst.gen == effect.gen:
                        log.info("stopping %s (%s)", effect.model, effect.reason)
                        self._forget_child(effect.model, effect.gen)
                        inst.stop(kill=effect.kill)
                case Reply():
                    work += self._reply(effect, now)
                case SampleMemory():
                    if self._sampler is not None and self._sampler.quick:
                        work += self._sample_in_place(effect, now)
                    else:
                        assert self._nursery is not None
                        self._nursery.start_soon(self._sample_memory, effect)
                case Prefetch():
                    self._start_prefetch(effect.model)
                case Emit():
                    if effect.event in ("troupe_evict", "troupe_memory"):
                        log.info("%s: %s %s", effect.model, effect.event, effect.data)
                    event: dict[str, Any] = {"model": effect.model, "event": effect.event}
                    if effect.data is not None:
                        event["data"] = effect.data
                    self._notify(event)
                    self.bus.publish(event)
                case Reloaded():
                    self._swap_catalogue(effect)
                case Measure():
                    self._start_measure(effect)
                case CancelMeasure():
                    job = self._measures.pop(effect.model, None)
                    if job is not None:
                        job.cancel()
                case DeleteFiles():
                    self._removing[effect.rid] = effect.model
                    self._start_scan(effect.rid, effect.model)

    def _notify(self, event: dict[str, Any]) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not take the scheduler down
                log.exception("event listener %r failed", listener)

    def _start_measure(self, effect: Measure) -> None:
        assert self._nursery is not None
        try:
            argv, env = self._launcher.measure_command(effect.model)
        except Exception as exc:  # a model that cannot be rendered is not measured
            log.warning("cannot measure %s: %s", effect.model, exc)
            self._send.send_nowait(MeasureFailed(effect.model, effect.fingerprint, str(exc)))
            return
        job = MeasureJob(effect.model, effect.fingerprint, argv, env, self._send.clone())
        self._measures[effect.model] = job
        self._nursery.start_soon(job.run)

    def _measure_done(self, model: str, fingerprint: str) -> None:
        job = self._measures.get(model)
        if job is not None and job.fingerprint == fingerprint:
            del self._measures[model]

    def _spawn(self, effect: Spawn, now: float) -> list[Effect]:
        assert self._nursery is not None
        try:
            spec = self._launcher.launch_spec(effect.model)
        except Exception as exc:  # a model that cannot be rendered fails alone
            log.exception("cannot prepare %s", effect.model)
            return self._core.exited(
                effect.model, effect.gen, 1, now, expected=False, detail=f"cannot start: {exc}"
            )
        inst = Instance(spec, effect.gen, self._send.clone(), self._ledger)
        self._instances[effect.model] = inst
        self._nursery.start_soon(inst.run, effect.delay)
        return []

    def _forget_child(self, model: str, gen: int) -> None:
        if self._transport is None:
            return
        try:
            self._transport.forget(model, gen)
        except Exception:  # the transport's trouble must not take the scheduler down
            log.exception("dropping the connections of %s failed", model)

    def _child_started(self, model: str, gen: int, connections: int) -> None:
        if self._transport is None:
            return
        try:
            self._transport.set_limit(model, gen, connections)
        except Exception:  # the transport's trouble must not take the scheduler down
            log.exception("telling the transport about %s failed", model)

    def _reply(self, effect: Reply, now: float) -> list[Effect]:
        channel = self._replies.pop(effect.to, None)
        if channel is None:
            return []
        try:
            channel.send_nowait(effect.result)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            # The asker is gone: a lease nobody will use must not stay counted in flight.
            if isinstance(effect.result, Grant):
                return self._core.release(effect.to, now)
        finally:
            channel.close()
        return []

    def _drop_reply(self, rid: int) -> None:
        channel = self._replies.pop(rid, None)
        if channel is not None:
            channel.close()

    # ----- catalogue: reload and removal -----------------------------------------------

    def _start_scan(self, rid: int, removed: str | None) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._scan, rid, removed)

    async def _scan(self, rid: int, removed: str | None) -> None:
        """In the actor's nursery: a client that leaves cannot stop it half-way."""
        result: PreparedCatalog | str
        try:
            if removed is not None:
                gone = await trio.to_thread.run_sync(
                    self._launcher.remove_files, removed, limiter=self._scan_limit
                )
                log.info(
                    "removing model name=%s from cache (%s)",
                    removed,
                    "succeeded" if gone else "partial",
                )
            result = await trio.to_thread.run_sync(self._launcher.scan, limiter=self._scan_limit)
        except ConfigError as exc:
            result = str(exc)
        except Exception as exc:  # a bug in a scan fails that reload, not the scheduler
            log.exception("reading the model sources failed")
            result = f"reading the model sources failed: {exc!r}"
        await self._send.send(Rescanned(rid, result, removed))

    def _rescanned(self, msg: Rescanned, now: float) -> list[Effect]:
        if isinstance(msg.result, str):
            self._removing.pop(msg.rid, None)
            return [Reply(msg.rid, Failure.server_error(msg.result))]
        fresh = msg.result
        for warning in fresh.catalog.warnings:
            log.warning("%s", warning)
        old = self._catalogue.catalog
        restart = sorted(
            name
            for name in self._core.running_names()
            if (a := old.get(name)) is None
            or (b := fresh.catalog.get(name)) is None
            or needs_restart(a.preset, b.preset)
        )
        if restart:
            log.info("reload restarts %s", ", ".join(restart))
        self._scanned[msg.rid] = fresh
        return self._core.reload(msg.rid, restart, fresh.configs, now)

    def _swap_catalogue(self, effect: Reloaded) -> None:
        self._catalogue = self._scanned[effect.rid]
        for rid in effect.rids:
            self._scanned.pop(rid, None)
            model = self._removing.pop(rid, None)
            if model is not None:
                self.bus.publish({"model": model, "event": "model_remove"})

    def _remove(self, rid: int, model: str, now: float) -> list[Effect]:
        """Upstream's checks: canonical names only (no alias), cache models only."""
        entry = self._catalogue.catalog.get(model)
        if entry is None:
            return [Reply(rid, Failure.server_error(f"model name={model} is not found"))]
        if not entry.can_remove:
            message = f"model name={model} is not removable (not from cache)"
            return [Reply(rid, Failure.server_error(message))]
        return self._core.remove(rid, model, now)

    def _start_prefetch(self, model: str) -> None:
        entry = self._catalogue.catalog.get(model)
        if entry is None or entry.model_path is None or self._nursery is None:
            return
        files = model_files(entry.model_path, entry.mmproj_path)
        self._nursery.start_soon(self._prefetch, model, files)

    async def _prefetch(self, model: str, files: list[Path]) -> None:
        try:
            asked = await trio.to_thread.run_sync(
                prefetch, files, limiter=self._prefetch_limit, abandon_on_cancel=True
            )
        except Exception:  # a hint: its failure must not take the scheduler down
            log.exception("reading ahead the files of %s failed", model)
            return
        if asked:
            log.debug("reading ahead %d MiB of %s while it waits", asked >> 20, model)

    # ----- memory ----------------------------------------------------------------------

    def _sample_in_place(self, effect: SampleMemory, now: float) -> list[Effect]:
        """A quick reading (host only) is taken here: the next model of a swap is admitted
        on it, and a worker thread's round trip would be most of its wait."""
        assert self._sampler is not None
        try:
            sample = self._sampler.sample(effect.pids)
        except Exception:  # a broken reading must not take the scheduler down
            log.exception("memory sampling failed")
            return self._core.memory_sample_failed(effect.version, now)
        return self._core.memory_sampled(sample, effect.version, now)

    async def _sample_memory(self, effect: SampleMemory) -> None:
        if self._sampler is None:
            await self._send.send(MemorySampleFailed(effect.version))
            return
        try:
            sample = await self._sampler.asample(effect.pids)
        except Exception:  # a broken reading must not take the scheduler down
            log.exception("memory sampling failed")
            await self._send.send(MemorySampleFailed(effect.version))
            return
        await self._send.send(MemorySampled(sample, effect.version))

    def _remember_memory(self) -> None:
        ledger = self._core.memory
        if ledger is None or self._nursery is None:
            return
        for model, used in ledger.effective.items():
            if self._remembered.get(model) != used:
                self._remembered[model] = dict(used)
                self._nursery.start_soon(self._save_memory, model, dict(used))

    async def _save_memory(self, model: str, used: dict[str, int]) -> None:
        try:
            await trio.to_thread.run_sync(
                self._launcher.remember_memory, model, used, limiter=self._save_limit
            )
        except Exception:  # a full disk must not take the scheduler down
            log.exception("saving what %s was seen to use failed", model)
