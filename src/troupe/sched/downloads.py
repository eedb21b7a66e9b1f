"""The download table: ``downloading`` and ``downloaded`` entries (upstream's download flow).

Pure, like the core: events in, effects out. Kept beside `SchedulerCore` rather than
in it because a download holds no child, no port and no ``--models-max`` slot: the
core's table, queue and ledger never see it. The scheduler actor owns both and is the
only writer of either.

An entry is ``downloading`` while its job runs, then ``downloaded`` (finished or
failed) until the reload that follows forgets it (`forget`); an unload cancels the job
and is answered when the job has ended; a removal (``DELETE /models``) cancels it too
and, once it ended, goes on as any removal (files deleted, then a reload). Two
downloads that would write the same blob are refused: the second answers 400.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import attrs

from troupe.sched.effects import Emit, Failure, Reply
from troupe.sched.events import DownloadEnded, DownloadProgressed, ModelStatusSet
from troupe.sched.status import Status

__all__ = [
    "CancelJob",
    "DownloadEffect",
    "DownloadTable",
    "DownloadView",
    "RemoveAfter",
    "StartJob",
]


@attrs.frozen
class StartJob:
    """Start the download actor for ``name`` (job id ``job``)."""

    name: str
    job: int


@attrs.frozen
class CancelJob:
    """Stop that job; ``discard``: delete its partial files (else keep them to resume)."""

    name: str
    job: int
    discard: bool


@attrs.frozen
class RemoveAfter:
    """The job of removal ``rid`` has ended: delete ``name``'s files and reload, then
    forget the entry (job ``job``) and answer ``rid``."""

    rid: int
    name: str
    job: int


DownloadEffect = StartJob | CancelJob | RemoveAfter | Emit | Reply


@attrs.frozen
class DownloadView:
    name: str
    job: int
    status: Status  # DOWNLOADING or DOWNLOADED
    progress: Mapping[str, tuple[int, int]]  # url -> (done, total)
    listed: str | None = None  # finished: the name the catalog lists it under
    error: str | None = None  # failed: why
    error_status: int = 0  # failed: the hub's HTTP status, if it refused
    cancelled: bool = False


@attrs.define
class _Entry:
    name: str
    job: int
    files: frozenset[str]
    status: Status = Status.DOWNLOADING
    progress: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    listed: str | None = None
    error: str | None = None
    error_status: int = 0
    cancelled: bool = False
    waiters: list[int] = attrs.field(factory=list)  # unloads, answered when it ends
    removers: list[int] = attrs.field(factory=list)  # removals, carried on when it ends

    def view(self) -> DownloadView:
        return DownloadView(
            self.name,
            self.job,
            self.status,
            dict(self.progress),
            self.listed,
            self.error,
            self.error_status,
            self.cancelled,
        )


class DownloadTable:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._ids = itertools.count(1)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def views(self) -> dict[str, DownloadView]:
        return {name: e.view() for name, e in sorted(self._entries.items())}

    def running(self) -> list[str]:
        return [e.name for e in self._entries.values() if e.status is Status.DOWNLOADING]

    def start(self, rid: int, name: str, files: frozenset[str]) -> list[DownloadEffect]:
        """``POST /models``. ``files`` names the blobs it will write (``repo/oid``)."""
        if name in self._entries:
            return [Reply(rid, Failure.bad_request(f"model '{name}' already exists"))]
        for other in self._entries.values():
            if other.status is Status.DOWNLOADING and other.files & files:
                msg = f"model '{name}' shares files with '{other.name}', which is downloading"
                return [Reply(rid, Failure.bad_request(msg))]
        entry = _Entry(name, next(self._ids), files)
        self._entries[name] = entry
        return [
            StartJob(name, entry.job),
            Emit(ModelStatusSet(name, Status.DOWNLOADING)),
            Reply(rid, None),
        ]

    def _current(self, name: str, job: int) -> _Entry | None:
        e = self._entries.get(name)
        return e if e is not None and e.job == job and e.status is Status.DOWNLOADING else None

    def progress(
        self, name: str, job: int, progress: Mapping[str, tuple[int, int]]
    ) -> list[DownloadEffect]:
        e = self._current(name, job)
        if e is None:
            return []
        e.progress.update(progress)
        return [Emit(DownloadProgressed(name, dict(e.progress)))]

    def finished(self, name: str, job: int, listed: str) -> list[DownloadEffect]:
        e = self._current(name, job)
        if e is None:
            return []
        e.status, e.listed = Status.DOWNLOADED, listed
        return [Emit(DownloadEnded(name)), *self._release(e)]

    def failed(
        self, name: str, job: int, reason: str, status: int, cancelled: bool
    ) -> list[DownloadEffect]:
        e = self._current(name, job)
        if e is None:
            return []
        e.status, e.error, e.error_status, e.cancelled = (
            Status.DOWNLOADED,
            reason,
            status,
            cancelled,
        )
        ended = DownloadEnded(name, reason, None if cancelled else status)
        return [Emit(ended), *self._release(e)]

    def _release(self, e: _Entry) -> list[DownloadEffect]:
        out: list[DownloadEffect] = [Reply(rid, None) for rid in e.waiters]
        out += [RemoveAfter(rid, e.name, e.job) for rid in e.removers]
        e.waiters.clear()
        e.removers.clear()
        return out

    def cancel(self, rid: int, name: str, *, discard: bool = True) -> list[DownloadEffect]:
        """``POST /models/unload`` (and ``DELETE``) on a download: answered once it ended."""
        e = self._entries.get(name)
        if e is None:
            return [Reply(rid, Failure.bad_request("model is not found"))]
        if e.status is not Status.DOWNLOADING:
            return [Reply(rid, Failure.bad_request("model is not running"))]
        e.waiters.append(rid)
        return [CancelJob(name, e.job, discard)]

    def remove(self, rid: int, name: str) -> list[DownloadEffect]:
        """``DELETE /models`` on a download: cancel it (discarding its partial files)."""
        e = self._entries[name]
        if e.status is not Status.DOWNLOADING:
            return [RemoveAfter(rid, name, e.job)]
        e.removers.append(rid)
        return [CancelJob(name, e.job, discard=True)]

    def ended(self) -> dict[str, int]:
        """The entries whose job ended, waiting for a reload: name -> job."""
        return {e.name: e.job for e in self._entries.values() if e.status is Status.DOWNLOADED}

    def cancel_all(self) -> list[DownloadEffect]:
        """Shutdown: every job stops and keeps its bytes; the next start resumes them."""
        return [
            CancelJob(e.name, e.job, discard=False)
            for e in self._entries.values()
            if e.status is Status.DOWNLOADING
        ]

    def forget(self, jobs: Mapping[str, int]) -> None:
        """After the reload that follows: the ended entries named are gone (erased by it)."""
        for name, job in jobs.items():
            e = self._entries.get(name)
            if e is not None and e.job == job and e.status is Status.DOWNLOADED:
                del self._entries[name]
