"""The catalog the model table was built from, and how it changes: reloads (a scan of
the model sources in a worker thread, then the core's reconciliation) and removals
(``DELETE /models``: its files deleted, then a reload).

Part of the scheduler actor: it runs in the scheduler's task and nursery. Scans report
back as a `Rescanned` message, so a client that leaves half-way stops nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import trio

from troupe.catalog.prepared import PreparedCatalog
from troupe.errors import ConfigError
from troupe.messages import Message, Rescanned
from troupe.modellog import about
from troupe.sched import Effect, Failure, Reply, SchedulerCore, Stop, StopReason
from troupe.sched.effects import Reloaded
from troupe.sched.events import ModelRemoved, SchedulerEvent

__all__ = ["CatalogKeeper", "Scanner"]

log = logging.getLogger("troupe.scheduler")


class Scanner(Protocol):
    """The blocking work of a reload (called in worker threads, one at a time)."""

    def scan(self) -> PreparedCatalog:
        """Read every model source again (ConfigError when one is broken)."""

    def remove_files(self, model: str) -> bool:
        """Delete ``model``'s cache files; False when nothing was removed."""


class CatalogKeeper:
    def __init__(
        self,
        scanner: Scanner,
        catalog: PreparedCatalog,
        send: trio.MemorySendChannel[Message],
        publish: Callable[[SchedulerEvent], None],
    ) -> None:
        self.current = catalog
        self._scanner = scanner
        self._send = send
        self._publish = publish
        self._scanned: dict[int, PreparedCatalog] = {}  # reloads the core has not done yet
        self._removing: dict[int, str] = {}  # removal rid -> model, announced after reload
        self._limit = trio.CapacityLimiter(1)  # file writes must not interleave
        self._swap_hooks: list[Callable[[Reloaded], None]] = []
        self.nursery: trio.Nursery | None = None

    def on_swap(self, hook: Callable[[Reloaded], None]) -> None:
        """Call ``hook`` after each catalog swap (the downloads forget ended jobs)."""
        self._swap_hooks.append(hook)

    # ----- starting ------------------------------------------------------------------------

    def rescan(self, rid: int) -> None:
        """A reload: scan the sources, then hand the result to the core."""
        self._start(rid, None)

    def delete_then_rescan(self, rid: int, model: str) -> None:
        """A removal whose child is gone: delete its files, then reload."""
        self._removing[rid] = model
        self._start(rid, model)

    def _start(self, rid: int, removed: str | None) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self._scan, rid, removed)

    async def _scan(self, rid: int, removed: str | None) -> None:
        """In the actor's nursery: a client that leaves cannot stop it half-way."""
        result: PreparedCatalog | str
        try:
            if removed is not None:
                gone = await trio.to_thread.run_sync(
                    self._scanner.remove_files, removed, limiter=self._limit
                )
                about(log, removed).info(
                    "removing from cache (%s)", "succeeded" if gone else "partial"
                )
            result = await trio.to_thread.run_sync(self._scanner.scan, limiter=self._limit)
        except ConfigError as exc:
            result = str(exc)
        except Exception as exc:  # a bug in a scan fails that reload, not the scheduler
            log.exception("reading the model sources failed")
            result = f"reading the model sources failed: {exc!r}"
        await self._send.send(Rescanned(rid, result, removed))

    # ----- the scheduler's side ------------------------------------------------------------

    def rescanned(self, msg: Rescanned, core: SchedulerCore, now: float) -> list[Effect]:
        if isinstance(msg.result, str):
            self._removing.pop(msg.rid, None)
            return [Reply(msg.rid, Failure.server_error(msg.result))]
        fresh = msg.result
        for warning in fresh.catalog.warnings:
            log.warning("%s", warning)
        self._scanned[msg.rid] = fresh
        effects = core.reload(msg.rid, fresh.configs, now)  # the core decides who restarts
        restart = [
            e.model for e in effects if isinstance(e, Stop) and e.cause.reason is StopReason.RELOAD
        ]
        if restart:
            log.info("reload restarts %s", ", ".join(restart))
        return effects

    def swap(self, effect: Reloaded) -> None:
        """The core took reload ``effect.rid``'s catalog: so does everyone else now."""
        self.current = self._scanned[effect.rid]
        for rid in effect.rids:
            self._scanned.pop(rid, None)
            model = self._removing.pop(rid, None)
            if model is not None:
                self._publish(ModelRemoved(model))
        for hook in self._swap_hooks:
            hook(effect)

    def remove(self, rid: int, model: str, core: SchedulerCore, now: float) -> list[Effect]:
        """``DELETE /models``, with upstream's checks: canonical names only (no alias),
        cache models only."""
        entry = self.current.catalog.get(model)
        if entry is None:
            return [Reply(rid, Failure.server_error(f"model name={model} is not found"))]
        if not entry.can_remove:
            message = f"model name={model} is not removable (not from cache)"
            return [Reply(rid, Failure.server_error(message))]
        return core.remove(rid, model, now)
