"""Which models the engine still has to measure, in what order, and what it said.

One measurement runs at a time (it starts an engine process). Every model is queued
when it enters the table; one that a request is about to load goes to the front.
A projection is kept per configuration (fingerprint): a reload that changes a
model's command line makes its figure stale, so it is measured again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

__all__ = ["ANSWER_WITHIN", "MAX_ATTEMPTS", "MeasureQueue", "Projection"]

MAX_ATTEMPTS = 2  # a failed measurement is tried again after a load, once
# Seconds a job has from its start to its answer (its engine's own limit is 60 s, from
# the process's start): a job that never answers (a spawn that never returns) costs the
# loads waiting for it this long, then they go ahead with the estimate.
ANSWER_WITHIN = 90.0


@attrs.frozen
class Projection:
    fingerprint: str
    need: Mapping[str, int]  # at the context the child will use
    high: Mapping[str, int] | None = None  # at the initial parameters, when fit shrank them


@attrs.define
class MeasureQueue:
    todo: list[str] = attrs.field(factory=list)
    running: tuple[str, str] | None = None  # (model, fingerprint)
    since: float = 0.0  # when the running job started (the core's clock)
    failures: dict[str, int] = attrs.field(factory=dict)
    projected: dict[str, Projection] = attrs.field(factory=dict)

    def add(self, names: Iterable[str]) -> None:
        for name in names:
            if name not in self.todo:
                self.todo.append(name)

    def bump(self, name: str) -> None:
        """``name`` is about to load: measure it next."""
        if name in self.todo:
            self.todo.remove(name)
            self.todo.insert(0, name)

    def pending(self, name: str) -> bool:
        return name in self.todo or (self.running is not None and self.running[0] == name)

    def start(self, fingerprints: Mapping[str, str], now: float) -> tuple[str, str] | None:
        """The next job, if none runs: (model, fingerprint)."""
        if self.running is not None or not self.todo:
            return None
        name = self.todo.pop(0)
        self.running = (name, fingerprints[name])
        self.since = now
        return self.running

    def deadline(self) -> float | None:
        """When the running job is given up on (None: none runs)."""
        return self.since + ANSWER_WITHIN if self.running is not None else None

    def finish(self, name: str, fingerprint: str) -> bool:
        """The job for ``name`` ended; True if it was the one running (not stale)."""
        if self.running == (name, fingerprint):
            self.running = None
            return True
        return False

    def failed(self, name: str) -> int:
        self.failures[name] = self.failures.get(name, 0) + 1
        return self.failures[name]

    def of(self, name: str, fingerprint: str) -> Projection | None:
        found = self.projected.get(name)
        return found if found is not None and found.fingerprint == fingerprint else None

    def forget(self, name: str) -> bool:
        """``name`` left the table or changed: drop what is known and queued. True when
        its job is running (the caller cancels it)."""
        self.projected.pop(name, None)
        self.failures.pop(name, None)
        if name in self.todo:
            self.todo.remove(name)
        if self.running is not None and self.running[0] == name:
            self.running = None
            return True
        return False
