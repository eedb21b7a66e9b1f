"""The next engine projection starts, if none runs (one engine process at a time):
models that parked loads and the queue wait for first."""

from __future__ import annotations

from troupe.sched.rules.parts import Rule

__all__ = ["MeasureNext"]


class MeasureNext(Rule):
    def due(self) -> bool:
        return self.p.projections is not None and not self.p.requests.closed

    def run(self, now: float) -> None:
        p = self.p
        assert p.projections is not None
        fingerprints = {m.name: m.config.fingerprint for m in p.table}
        wanted = p.requests.wanted() + [e.model for e in p.queue.entries]
        p.projections.start_next(fingerprints, wanted, now)
