"""The admission queue (llama.cpp's ``server_lru_sched``): one entry per model, FIFO.

Requests for the same model share one entry, so they need one slot and are all
released by the single load that entry performs. Only the head may load; an entry
whose load succeeded stays until its waiters leave, which protects the model from
eviction before they use it.
"""

from __future__ import annotations

import attrs

__all__ = ["AdmissionQueue", "QueueEntry"]


@attrs.define
class QueueEntry:
    model: str
    waiters: int = 1
    loading: bool = False  # the head claimed its slot and is loading


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

    def can_claim(self, model: str) -> bool:
        """Is it ``model``'s turn: at the head, and nobody loading it yet."""
        return bool(self.entries) and self.entries[0].model == model and not self.entries[0].loading

    def claim(self, model: str) -> None:
        assert self.can_claim(model)
        self.entries[0].loading = True

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
