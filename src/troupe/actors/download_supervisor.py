"""The scheduler's side of downloads: the download table and one actor per job.

Part of the scheduler actor (it runs in the scheduler's task and nursery, and the
scheduler is the only caller), kept in its own module so the scheduler's own code
only routes messages here. `dispatch` takes the download messages and returns the
effects the scheduler carries out as for the core (events, replies); starting and
cancelling the actors happens here, without awaiting anything.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from troupe.actors.download import DownloadActor, DownloadSpec
from troupe.download.plan import DownloadPlan
from troupe.messages import (
    DownloadFailed,
    DownloadFinished,
    DownloadProgress,
    Message,
    StartDownload,
)
from troupe.modellog import about
from troupe.sched.downloads import (
    CancelJob,
    DownloadEffect,
    DownloadTable,
    DownloadView,
    RemoveAfter,
    StartJob,
)
from troupe.sched.effects import Emit, Failure, Reply

__all__ = ["DownloadLauncher", "DownloadSupervisor"]

log = logging.getLogger("troupe.download")

DownloadMessage = StartDownload | DownloadProgress | DownloadFinished | DownloadFailed
Out = Emit | Reply | RemoveAfter  # what the scheduler carries out


class DownloadLauncher(Protocol):
    """Where the scheduler gets what a job needs (the router context)."""

    def download_spec(
        self, name: str, job: int, plan: DownloadPlan | None, error: str, error_status: int
    ) -> DownloadSpec: ...


class DownloadSupervisor:
    def __init__(
        self, launcher: DownloadLauncher | None, outbox: trio.MemorySendChannel[Message]
    ) -> None:
        self.table = DownloadTable()
        self._launcher = launcher
        self._outbox = outbox  # cloned for each actor
        self._actors: dict[str, DownloadActor] = {}
        self._pending: dict[str, tuple[DownloadPlan | None, str, int]] = {}
        self.nursery: trio.Nursery | None = None
        self.closing = False  # shutting down: no new download starts

    def __contains__(self, name: str) -> bool:
        return name in self.table

    def views(self) -> dict[str, DownloadView]:
        return self.table.views()

    def dispatch(self, msg: DownloadMessage) -> list[Out]:
        match msg:
            case StartDownload():
                if self.closing:
                    return [Reply(msg.rid, Failure.unavailable("server is shutting down"))]
                if self._launcher is None:
                    msg_text = "downloading models is not enabled in this router"
                    return [Reply(msg.rid, Failure(501, msg_text, "not_supported_error"))]
                plan = msg.plan
                files = (
                    frozenset(f"{plan.repo}/{f.oid}" for f in plan.files) if plan else frozenset()
                )
                self._pending[msg.name] = (msg.plan, msg.error, msg.error_status)
                try:
                    return self._carry_out(self.table.start(msg.rid, msg.name, files))
                finally:
                    self._pending.pop(msg.name, None)
            case DownloadProgress():
                return self._carry_out(self.table.progress(msg.name, msg.job, msg.progress))
            case DownloadFinished():
                self._ended(msg.name, msg.job)
                return self._carry_out(self.table.finished(msg.name, msg.job, msg.listed))
            case DownloadFailed():
                self._ended(msg.name, msg.job)
                effects = self.table.failed(
                    msg.name, msg.job, msg.reason, msg.status, msg.cancelled
                )
                return self._carry_out(effects)
        raise AssertionError(f"not a download message: {msg!r}")

    def cancel(self, rid: int, name: str) -> list[Out]:
        return self._carry_out(self.table.cancel(rid, name))

    def remove(self, rid: int, name: str) -> list[Out]:
        return self._carry_out(self.table.remove(rid, name))

    def ended(self) -> dict[str, int]:
        return self.table.ended()

    def forget(self, jobs: dict[str, int]) -> None:
        self.table.forget(jobs)

    def stop_all(self) -> None:
        """Shutdown: every job pauses (its bytes and journal entry kept for the next start)."""
        self.closing = True
        self._carry_out(self.table.cancel_all())

    def _ended(self, name: str, job: int) -> None:
        actor = self._actors.get(name)
        if actor is not None and actor.spec.job == job:
            del self._actors[name]

    def _carry_out(self, effects: list[DownloadEffect]) -> list[Out]:
        out: list[Out] = []
        for effect in effects:
            match effect:
                case StartJob():
                    self._start(effect)
                case CancelJob():
                    actor = self._actors.get(effect.name)
                    if actor is not None and actor.spec.job == effect.job:
                        about(log, effect.name).info("cancelling the download")
                        actor.cancel(discard=effect.discard)
                case Emit() | Reply() | RemoveAfter():
                    out.append(effect)
        return out

    def _start(self, effect: StartJob) -> None:
        assert self.nursery is not None
        assert self._launcher is not None
        plan, error, status = self._pending[effect.name]
        spec = self._launcher.download_spec(effect.name, effect.job, plan, error, status)
        actor = DownloadActor(spec, self._outbox.clone())
        self._actors[effect.name] = actor
        about(log, effect.name).info("starting the download")
        self.nursery.start_soon(actor.run)
