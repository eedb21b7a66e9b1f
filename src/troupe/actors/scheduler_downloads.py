"""The scheduler's download messages: routed to the download table, and what follows.

A layer of the scheduler actor (between `EffectRunner` and `Scheduler`), so the core's
dispatch stays as it is: a download holds no child and no slot, so the core never sees
one. An unload or a ``DELETE`` naming a download goes to its job; a job that ended is
followed by a reload the scheduler starts itself (upstream reloads implicitly on the
next lookup), and its entry goes with that reload's swap, so no reader ever sees the
model under both names, or under neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from troupe.actors.download_supervisor import DownloadLauncher, DownloadSupervisor
from troupe.actors.scheduler_effects import EffectRunner
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
from troupe.sched.downloads import RemoveAfter
from troupe.sched.effects import Reloaded

__all__ = ["DownloadRunner"]


class DownloadRunner(EffectRunner):
    _downloads: DownloadSupervisor
    _download_reloads: dict[int, dict[str, int]]  # reload rid -> the ended jobs it clears
    _ids: Iterator[int]

    def _init_downloads(self, launcher: DownloadLauncher | None) -> None:
        self._downloads = DownloadSupervisor(launcher, self._send.clone())
        self._download_reloads = {}

    def _dispatch_download(self, msg: Message) -> list[Effect] | None:
        """The effects of a download message; None for any other message."""
        match msg:
            case UnloadModel() if msg.model in self._downloads:
                self._replies[msg.rid] = msg.reply
                return self._download_effects(self._downloads.cancel(msg.rid, msg.model))
            case RemoveModel() if msg.model in self._downloads and (
                self._catalogue.catalog.get(msg.model) is None
            ):
                self._replies[msg.rid] = msg.reply
                return self._download_effects(self._downloads.remove(msg.rid, msg.model))
            case Rescanned() if isinstance(msg.result, str) and msg.rid in self._download_reloads:
                self._downloads.forget(self._download_reloads.pop(msg.rid))  # reload failed
                return None  # answered (to nobody, or the DELETE) as any failed reload
            case StartDownload() if self._catalogue.catalog.resolve(msg.name) is not None:
                exists = Failure.bad_request(f"model '{msg.name}' already exists")
                self._replies[msg.rid] = msg.reply
                return [Reply(msg.rid, exists)]
            case StartDownload():
                self._replies[msg.rid] = msg.reply
                return self._download_effects(self._downloads.dispatch(msg))
            case DownloadProgress():
                return self._download_effects(self._downloads.dispatch(msg))
            case DownloadFinished() | DownloadFailed():
                out = self._downloads.dispatch(msg)
                if not any(isinstance(e, RemoveAfter) for e in out):
                    self._reload_after_download()  # else the removal's own reload does it
                return self._download_effects(out)
        return None

    def _download_effects(self, out: Sequence[Effect | RemoveAfter]) -> list[Effect]:
        effects: list[Effect] = []
        for item in out:
            if isinstance(item, RemoveAfter):
                # Its job has ended: from here on it is a removal as any other (delete the
                # files, re-scan, reload, model_remove), and its entry goes with that reload.
                self._download_reloads[item.rid] = {**self._downloads.ended(), item.name: item.job}
                self._removing[item.rid] = item.name
                self._start_scan(item.rid, item.name)
            else:
                effects.append(item)
        return effects

    def _reload_after_download(self) -> None:
        """A job ended: reload, so a finished model is listed under its ``org/repo:TAG``
        name and a failed one is gone. The entries ended by now go with this reload."""
        rid = next(self._ids)
        self._download_reloads[rid] = self._downloads.ended()
        self._start_scan(rid, None)

    def _swap_catalogue(self, effect: Reloaded) -> None:
        super()._swap_catalogue(effect)
        for rid in effect.rids:
            jobs = self._download_reloads.pop(rid, None)
            if jobs:
                self._downloads.forget(jobs)
