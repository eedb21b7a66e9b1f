"""The scheduler's download messages: routed to the download table, and what follows.

Part of the scheduler actor. A download holds no child and no slot, so the core never
sees one. An unload or a ``DELETE`` naming a download goes to its job; a job that
ended is followed by a reload the scheduler starts itself (upstream reloads
implicitly on the next lookup), and its entry goes with that reload's swap, so no
reader ever sees the model under both names, or under neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from troupe.actors.catalog import CatalogKeeper
from troupe.actors.download_supervisor import DownloadLauncher, DownloadSupervisor
from troupe.actors.replies import Replies
from troupe.messages import (
    DownloadFailed,
    DownloadFinished,
    DownloadProgress,
    Message,
    RemoveModel,
    Rescanned,
    StartDownload,
    UnloadModel,
)
from troupe.sched import Effect, Failure, Reply
from troupe.sched.downloads import DownloadView, RemoveAfter
from troupe.sched.effects import Reloaded

__all__ = ["SchedulerDownloads"]


class SchedulerDownloads:
    def __init__(
        self,
        launcher: DownloadLauncher | None,
        keeper: CatalogKeeper,
        replies: Replies,
        send: trio.MemorySendChannel[Message],
        new_rid: Callable[[], int],
    ) -> None:
        self._jobs = DownloadSupervisor(launcher, send)
        self._keeper = keeper
        self._replies = replies
        self._new_rid = new_rid
        self._reloads: dict[int, dict[str, int]] = {}  # reload rid -> the ended jobs it clears
        keeper.on_swap(self._swapped)

    @property
    def nursery(self) -> trio.Nursery | None:
        return self._jobs.nursery

    @nursery.setter
    def nursery(self, nursery: trio.Nursery) -> None:
        self._jobs.nursery = nursery

    def views(self) -> dict[str, DownloadView]:
        return self._jobs.views()

    def stop_all(self) -> None:
        """Shutdown: jobs pause (the journal resumes them at the next start)."""
        self._jobs.stop_all()

    def dispatch(self, msg: Message) -> list[Effect] | None:
        """The effects of a download message; None for any other message."""
        jobs = self._jobs
        match msg:
            case UnloadModel() if msg.model in jobs:
                self._replies.expect(msg.rid, msg.reply)
                return self._effects(jobs.cancel(msg.rid, msg.model))
            case RemoveModel() if msg.model in jobs and (
                self._keeper.current.catalog.get(msg.model) is None
            ):
                self._replies.expect(msg.rid, msg.reply)
                return self._effects(jobs.remove(msg.rid, msg.model))
            case Rescanned() if isinstance(msg.result, str) and msg.rid in self._reloads:
                jobs.forget(self._reloads.pop(msg.rid))  # the reload failed
                return None  # answered (to nobody, or the DELETE) as any failed reload
            case StartDownload() if self._keeper.current.catalog.resolve(msg.name) is not None:
                exists = Failure.bad_request(f"model '{msg.name}' already exists")
                self._replies.expect(msg.rid, msg.reply)
                return [Reply(msg.rid, exists)]
            case StartDownload():
                self._replies.expect(msg.rid, msg.reply)
                return self._effects(jobs.dispatch(msg))
            case DownloadProgress():
                return self._effects(jobs.dispatch(msg))
            case DownloadFinished() | DownloadFailed():
                out = jobs.dispatch(msg)
                if not any(isinstance(e, RemoveAfter) for e in out):
                    self._reload_after_download()  # else the removal's own reload does it
                return self._effects(out)
        return None

    def _effects(self, out: Sequence[Effect | RemoveAfter]) -> list[Effect]:
        effects: list[Effect] = []
        for item in out:
            if isinstance(item, RemoveAfter):
                # Its job has ended: from here on it is a removal as any other (delete the
                # files, re-scan, reload, model_remove), and its entry goes with that reload.
                self._reloads[item.rid] = {**self._jobs.ended(), item.name: item.job}
                self._keeper.delete_then_rescan(item.rid, item.name)
            else:
                effects.append(item)
        return effects

    def _reload_after_download(self) -> None:
        """A job ended: reload, so a finished model is listed under its ``org/repo:TAG``
        name and a failed one is gone. The entries ended by now go with this reload."""
        rid = self._new_rid()
        self._reloads[rid] = self._jobs.ended()
        self._keeper.rescan(rid)

    def _swapped(self, effect: Reloaded) -> None:
        for rid in effect.rids:
            jobs = self._reloads.pop(rid, None)
            if jobs:
                self._jobs.forget(jobs)
