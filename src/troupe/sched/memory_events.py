"""Memory events: estimates, readings of what children use, the engine's projections."""

from __future__ import annotations

from collections.abc import Mapping

from troupe.sched.effects import Effect
from troupe.sched.lifecycle import Lifecycle
from troupe.sched.measuring import Projected
from troupe.sched.memory import MemorySample
from troupe.sched.status import Status

__all__ = ["MemoryEvents"]


class MemoryEvents(Lifecycle):
    def set_estimate(self, model: str, need: Mapping[str, int] | None, now: float) -> list[Effect]:
        """What loading ``model`` is expected to take per device (None: unknown)."""
        if self.memory is not None:
            self.memory.set_estimate(model, need)
            self._settle(now)
        return self._flush()

    def memory_sampled(self, sample: MemorySample, version: int, now: float) -> list[Effect]:
        """A reading asked for by a `SampleMemory` effect of the same ``version``."""
        self._sampling = False
        self._sample = sample
        self._sampled_version = version
        if version >= self._true_up_version:
            self._true_up_due = None  # this reading trues up every model up by then
        if self.memory is not None:
            for name, m in self._models.items():
                used = sample.footprint.get(m.pid) if m.pid else None
                if used and m.status is Status.LOADED and not m.stopping:
                    self.memory.true_up(name, used)  # what it really holds, from now on
        self._settle(now)
        return self._flush()

    def memory_sample_failed(self, version: int, now: float) -> list[Effect]:
        """The reading asked for by a `SampleMemory` of ``version`` could not be made.
        As upstream settles a failed measurement: loads waiting for it go ahead without
        the memory check (until the next change asks for a new reading)."""
        self._sampling = False
        self._sample_failed_version = version
        self._settle(now)
        return self._flush()

    def measured(
        self,
        model: str,
        fingerprint: str,
        need: Mapping[str, int],
        high: Mapping[str, int] | None,
        now: float,
    ) -> list[Effect]:
        """The engine's projection for ``model`` under ``fingerprint`` (a `Measure`)."""
        queue = self._measure
        if queue is not None and queue.finish(model, fingerprint):
            m = self._models.get(model)
            if m is not None and m.config.fingerprint == fingerprint and any(need.values()):
                queue.projected[model] = Projected(fingerprint, dict(need), high)
                self._apply_estimate(m.config)
                self._emit(model, "troupe_memory", {"projected": dict(need), "source": "engine"})
        self._settle(now)
        return self._flush()

    def measure_failed(self, model: str, fingerprint: str, reason: str, now: float) -> list[Effect]:
        """The engine could not project ``model``: the estimate stands (upstream settles a
        failed measurement: the load goes on), and it is measured again after a load."""
        queue = self._measure
        if queue is not None and queue.finish(model, fingerprint):
            queue.failed(model)
            self._emit(model, "troupe_memory", {"measure_failed": reason, "source": "estimate"})
        self._settle(now)
        return self._flush()
