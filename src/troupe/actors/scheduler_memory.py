"""The scheduler's memory work: readings of what is free and what each child holds, the
engine's projections (one measure job at a time), and what a model was seen to hold,
saved for the next start.

Part of the scheduler actor: it runs in the scheduler's task and nursery. Blocking
work runs in worker threads and reports back as a message; a quick host-only reading
is taken in place (the next model of a swap is admitted on it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import trio

from troupe.actors.measure import MeasureJob
from troupe.actors.memory import MemorySampler
from troupe.messages import MeasureFailed, MemorySampled, MemorySampleFailed, Message
from troupe.modellog import about
from troupe.sched import Effect, SampleMemory, SchedulerCore
from troupe.sched.effects import Measure

__all__ = ["MemoryWork", "Projector"]

log = logging.getLogger("troupe.scheduler")


class Projector(Protocol):
    def measure_command(self, model: str) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of ``model``'s child, for a measurement."""

    def remember_memory(self, model: str, used: Mapping[str, int]) -> None:
        """What ``model`` was seen to hold once up (kept for the next estimate; blocks)."""


class MemoryWork:
    def __init__(
        self,
        core: SchedulerCore,
        projector: Projector,
        sampler: MemorySampler | None,
        send: trio.MemorySendChannel[Message],
    ) -> None:
        self._core = core
        self._projector = projector
        self.sampler = sampler
        self._send = send
        self._measures: dict[str, MeasureJob] = {}  # model -> its running measurement
        self._remembered: dict[str, Mapping[str, int]] = {}
        self._save_limit = trio.CapacityLimiter(1)  # file writes must not interleave
        self.nursery: trio.Nursery | None = None

    # ----- readings ------------------------------------------------------------------------

    def sample(self, effect: SampleMemory, now: float) -> list[Effect]:
        if self.sampler is not None and self.sampler.quick:
            return self._sample_in_place(effect, now)
        assert self.nursery is not None
        self.nursery.start_soon(self._sample, effect)
        return []

    def _sample_in_place(self, effect: SampleMemory, now: float) -> list[Effect]:
        """A quick reading (host only) is taken here: the next model of a swap is admitted
        on it, and a worker thread's round trip would be most of its wait."""
        assert self.sampler is not None
        try:
            sample = self.sampler.sample(effect.pids)
        except Exception:  # a broken reading must not take the scheduler down
            log.exception("memory sampling failed")
            return self._core.memory_sample_failed(effect.version, now)
        return self._core.memory_sampled(sample, effect.version, now)

    async def _sample(self, effect: SampleMemory) -> None:
        if self.sampler is None:
            await self._send.send(MemorySampleFailed(effect.version))
            return
        try:
            sample = await self.sampler.asample(effect.pids)
        except Exception:  # a broken reading must not take the scheduler down
            log.exception("memory sampling failed")
            await self._send.send(MemorySampleFailed(effect.version))
            return
        await self._send.send(MemorySampled(sample, effect.version))

    # ----- projections ---------------------------------------------------------------------

    def start_measure(self, effect: Measure) -> None:
        assert self.nursery is not None
        try:
            argv, env = self._projector.measure_command(effect.model)
        except Exception as exc:  # a model that cannot be rendered is not measured
            about(log, effect.model).warning("cannot measure: %s", exc)
            self._send.send_nowait(MeasureFailed(effect.model, effect.fingerprint, str(exc)))
            return
        job = MeasureJob(effect.model, effect.fingerprint, argv, env, self._send.clone())
        self._measures[effect.model] = job
        self.nursery.start_soon(job.run)

    def cancel_measure(self, model: str) -> None:
        job = self._measures.pop(model, None)
        if job is not None:
            job.cancel()

    def measure_done(self, model: str, fingerprint: str) -> None:
        job = self._measures.get(model)
        if job is not None and job.fingerprint == fingerprint:
            del self._measures[model]

    # ----- observations --------------------------------------------------------------------

    def remember(self) -> None:
        """Save what each model was newly seen to hold (after a reading)."""
        ledger = self._core.ledger
        if ledger is None or self.nursery is None:
            return
        for model, used in ledger.effective.items():
            if self._remembered.get(model) != used:
                self._remembered[model] = dict(used)
                self.nursery.start_soon(self._save, model, dict(used))

    async def _save(self, model: str, used: dict[str, int]) -> None:
        try:
            await trio.to_thread.run_sync(
                self._projector.remember_memory, model, used, limiter=self._save_limit
            )
        except Exception:  # a full disk must not take the scheduler down
            about(log, model).exception("saving what it was seen to use failed")
