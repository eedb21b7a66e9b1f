"""What the scheduler core shows of itself: the snapshot readers get, and the words it
uses for why a request waits (``/models``, the ``troupe_queue`` SSE events)."""

from __future__ import annotations

from troupe.sched.base import SWAP_WINDOW, CoreBase
from troupe.sched.effects import Effect
from troupe.sched.memory import PerDevice
from troupe.sched.status import Status
from troupe.sched.table import ModelState, ModelView, Snapshot

__all__ = ["Views"]


class Views(CoreBase):
    def snapshot(self) -> Snapshot:
        waiting = {e.model: e.waiters for e in self._queue.entries}
        reasons = {e.model: self._wait_reason(e.model) for e in self._queue.entries}
        views = {
            name: ModelView(
                name=name,
                status=m.status,
                port=m.port,
                pid=m.pid,
                exit_code=m.exit_code,
                failed=m.failed,
                stopping=m.stopping,
                progress=m.progress,
                loaded_info=m.loaded_info,
                in_flight=m.in_flight,
                waiting=waiting.get(name, 0),
                queue_position=self._queue.position(name),
                last_used=m.last_used,
                last_load_seconds=m.last_load_seconds,
                last_eviction=m.last_eviction,
                last_error=m.last_error,
                held_until=m.held_until,
                pin=m.config.pin,
                ttl=m.config.ttl,
                wait_reason=reasons.get(name),
                draining_for=m.draining_for,
                memory_need=self.memory.estimates.get(name) if self.memory else None,
                memory_used=self.memory.effective.get(name) if self.memory else None,
                memory_reserved=self.memory.need(name) if self.memory else None,
                memory_source=self._memory_source(m),
                memory_high=self._projection_high(m),
            )
            for name, m in sorted(self._models.items())
        }
        queue = tuple((e.model, e.waiters) for e in self._queue.entries)
        self._version += 1
        return Snapshot(
            version=self._version,
            models=views,
            models_max=self.models_max,
            queue=queue,
            devices=self._sample.devices if self._sample else (),
            recent_swaps=self._recent_swaps(),
        )

    def _flush(self) -> list[Effect]:
        self._emit_queue_changes()
        out, self._out = self._out, []
        return out

    def _emit_queue_changes(self) -> None:
        """A ``troupe_queue`` event for each entry whose waiters, position or reason for
        waiting changed."""
        now_seen = {
            e.model: (e.waiters, i + 1, self._wait_reason(e.model))
            for i, e in enumerate(self._queue.entries)
        }
        for model in sorted(now_seen.keys() | self._queue_seen.keys()):
            state = now_seen.get(model)
            if state != self._queue_seen.get(model):
                waiters, position, reason = state if state is not None else (0, None, None)
                data = {"waiting": waiters, "position": position, "reason": reason}
                self._emit(model, "troupe_queue", data)
        self._queue_seen = now_seen

    def _wait_reason(self, model: str) -> str:
        """Why the requests queued for ``model`` wait, in words for /models and SSE."""
        m = self._models.get(model)
        entry = self._queue.find(model)
        if m is None or entry is None:
            return "waiting"
        if entry.loading or m.status is Status.LOADING:
            return "loading"
        if m.stopping:
            return "waiting for its previous instance to stop"
        if m.draining_for is not None:
            return f"being swapped out for {m.draining_for}: waits for the next instance"
        if self._reloading:
            return "waiting for a reload to finish"
        if m.status.is_ready_or_sleeping:
            return "ready"
        first = self._queue.next_to_claim()
        if first is not None and first.model != model:
            return f"in line behind {first.model}"
        draining = [n for n, o in self._models.items() if o.draining_for == model]
        if draining:
            return f"waiting for {draining[0]} to finish its requests (swapped out for it)"
        if any(o.stopping for o in self._models.values()):
            return "waiting for a model to stop"
        if not self._has_capacity():
            return "waiting for a slot: every loaded model is busy or pinned"
        return "waiting for memory"

    def _memory_source(self, m: ModelState) -> str | None:
        if self.memory is None:
            return None
        name = m.config.name
        if self._measure is not None and self._measure.of(name, m.config.fingerprint):
            return "engine"
        return "estimate" if self.memory.estimates.get(name) else None

    def _projection_high(self, m: ModelState) -> PerDevice | None:
        if self._measure is None:
            return None
        found = self._measure.of(m.config.name, m.config.fingerprint)
        return found.high if found is not None else None

    def _recent_swaps(self) -> tuple[float, ...]:
        while self._swaps and self._swaps[0] <= self._now - SWAP_WINDOW:
            self._swaps.popleft()
        return tuple(self._swaps)
