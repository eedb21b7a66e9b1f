"""The admission queue (llama.cpp's ``server_lru_sched``): one entry per model, FIFO.

Requests for the same model share one entry, so they need one slot and are all
released by the single load that entry performs. Entries claim slots in arrival
order; an entry whose load succeeded stays until its waiters leave, which protects
the model from eviction before they use it.

Upstream lets only the head load: while it loads, every other entry waits, so one
load that never finishes (a child stopped while loading) blocks every other model.
Here the first entry that is not loading yet may claim a free slot, so loads of
different models run in parallel while arrival order is kept among those waiting.
"""

from __future__ import annotations

import attrs

__all__ = ["AdmissionQueue", "QueueEntry"]


@attrs.define
class QueueEntry:
    model: str
    waiters: int = 1
    loading: bool = False  # the head claimed its slot and is loading
    # Why its requests wait, in words: recorded by the settle rule that last decided for
    # it (`troupe.sched.rules`); /models and troupe_queue events show it as it is.
    reason: str = "waiting"
    # The gate's own reason, before what frees room first (a drain, a stop) is said: the
    # `Explain` rule says it again once every rule of the settle has run.
    gated: str | None = None


@attrs.define
class AdmissionQueue:
    entries: list[QueueEntry] = attrs.field(factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, model: str) -> QueueEntry | None:
        for e in self.entries:
            if e.model == model:
                return e
        return None

    def position(self, model: str) -> int | None:
        for i, e in enumerate(self.entries):
            if e.model == model:
                return i + 1
        return None

    def join(self, model: str) -> QueueEntry:
        entry = self.find(model)
        if entry is not None:
            entry.waiters += 1
            return entry
        entry = QueueEntry(model)
        self.entries.append(entry)
        return entry

    def leave(self, model: str) -> None:
        entry = self.find(model)
        if entry is None:
            return
        entry.waiters -= 1
        if entry.waiters <= 0:
            self.entries.remove(entry)

    def next_to_claim(self) -> QueueEntry | None:
        """The first entry not loading yet: the next to get a free slot."""
        return next((e for e in self.entries if not e.loading), None)

    def can_claim(self, model: str) -> bool:
        """Is it ``model``'s turn: every entry ahead of it is loading already."""
        entry = self.next_to_claim()
        return entry is not None and entry.model == model

    def claim(self, model: str) -> None:
        entry = self.next_to_claim()
        assert entry is not None
        assert entry.model == model
        entry.loading = True

    def claim_failed(self, model: str) -> None:
        """Back in line: the entry keeps its place and is retried."""
        entry = self.find(model)
        if entry is not None:
            entry.loading = False

    def drop(self, model: str) -> int:
        """Remove ``model``'s entry whatever its waiters; returns how many it had."""
        entry = self.find(model)
        if entry is None:
            return 0
        self.entries.remove(entry)
        return entry.waiters
