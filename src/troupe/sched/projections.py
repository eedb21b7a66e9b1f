"""The engine's own memory projections, as the core uses them: which model is measured
next (one engine process at a time), and the best figure admission counts before a
model runs (the projection for its command line, else the catalog's estimate)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from troupe.sched.effects import CancelMeasure, Measure
from troupe.sched.events import MemoryProjected, ProjectionFailed
from troupe.sched.measuring import ANSWER_WITHIN, MAX_ATTEMPTS, MeasureQueue, Projection
from troupe.sched.memory import MemoryLedger
from troupe.sched.outbox import Outbox
from troupe.sched.table import ModelConfig

__all__ = ["Projections"]


class Projections:
    def __init__(self, ledger: MemoryLedger, outbox: Outbox) -> None:
        self.queue = MeasureQueue()
        self._ledger = ledger
        self._out = outbox

    def add(self, names: Iterable[str]) -> None:
        self.queue.add(names)

    def pending(self, name: str) -> bool:
        return self.queue.pending(name)

    def bump(self, name: str) -> None:
        """``name`` is about to load: measure it next."""
        self.queue.bump(name)

    def of(self, name: str, fingerprint: str) -> Projection | None:
        return self.queue.of(name, fingerprint)

    def forget(self, name: str) -> None:
        """``name`` left the table or changed: its figure goes, a job for it is cancelled."""
        if self.queue.forget(name):
            self._out.add(CancelMeasure(name))

    def estimate(self, config: ModelConfig) -> None:
        found = self.queue.of(config.name, config.fingerprint)
        self._ledger.set_estimate(config.name, found.need if found else config.need)

    def start_next(self, fingerprints: Mapping[str, str], wanted: list[str], now: float) -> None:
        """Start the next job, if none runs: models requests wait for first, in order."""
        queue = self.queue
        queue.todo = [n for n in queue.todo if n in fingerprints]
        for name in reversed(wanted):
            queue.bump(name)
        job = queue.start(fingerprints, now)
        if job is not None:
            self._out.add(Measure(*job))

    def deadline(self) -> float | None:
        return self.queue.deadline()

    def expire(self, now: float) -> None:
        """A job with no answer by its deadline fails (the estimate stands, the loads
        waiting for it go ahead) and is cancelled; an answer after is stale."""
        due = self.queue.deadline()
        running = self.queue.running
        if running is not None and due is not None and due <= now:
            self.failed(*running, f"no answer within {ANSWER_WITHIN:g} s")
            self._out.add(CancelMeasure(running[0]))

    def cancel_all(self) -> None:
        """Shutdown: nothing more is measured."""
        self.queue.todo.clear()
        if self.queue.running is not None:
            self._out.add(CancelMeasure(self.queue.running[0]))
            self.queue.running = None

    def measured(
        self,
        config: ModelConfig | None,
        model: str,
        fingerprint: str,
        need: Mapping[str, int],
        high: Mapping[str, int] | None,
    ) -> None:
        """The job for ``model`` under ``fingerprint`` ended with a projection; it counts
        if it is for the model's command line now (``config``)."""
        if not self.queue.finish(model, fingerprint):
            return  # a stale job
        if config is not None and config.fingerprint == fingerprint and any(need.values()):
            self.queue.projected[model] = Projection(fingerprint, dict(need), high)
            self.estimate(config)
            self._out.emit(MemoryProjected(model, dict(need)))

    def failed(self, model: str, fingerprint: str, reason: str) -> None:
        """The engine could not project ``model``: the estimate stands."""
        if self.queue.finish(model, fingerprint):
            self.queue.failed(model)
            self._out.emit(ProjectionFailed(model, reason))

    def again_after_load(self, model: str) -> None:
        """A model whose measurement failed is measured again once it loaded (twice at
        most): a projection made with the child up may well work."""
        tries = self.queue.failures.get(model, 0)
        if 0 < tries < MAX_ATTEMPTS and not self.queue.pending(model):
            self.queue.add([model])
