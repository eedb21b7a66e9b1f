"""A whole download: every file of a plan fetched, verified, then linked into the cache.

Files are fetched in parallel (at most `PARALLEL` at once, as llama.cpp runs its tasks
in parallel), each by `fetch_file`. Only when every blob is verified does the snapshot
appear (links, then the ref): a reader never sees half a model. Progress is kept per
file URL and reported, cumulative, by one reporter task at most every `interval`
seconds and once at the end, so a slow reader of progress never slows the bytes.

Outcomes: `run` returns (all files in place) or raises `HubError`, `PlanError`,
`ChecksumError`, `BusyError` or `OSError`, the first failure of any file (the other
files are cancelled). A cancellation propagates; the caller decides whether it was a
pause (partial files and journal entry kept, to resume) or a cancel (`discard`).
A failure keeps the partial bytes of the files that were not corrupt but drops the
journal entry: asking for the same model again resumes them; nothing resumes it alone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from troupe.download.hubapi import HubClient
from troupe.download.journal import Journal
from troupe.download.layout import RepoLayout
from troupe.download.plan import DownloadPlan, PlannedFile
from troupe.download.transfer import DEFAULT_POLICY, RetryPolicy, fetch_file

if TYPE_CHECKING:
    import httpx  # loaded with the client (troupe.download.hubapi.open_client)

__all__ = ["PARALLEL", "DownloadJob", "ProgressMap", "Reporter"]

log = logging.getLogger("troupe.download")

PARALLEL = 4

ProgressMap = Mapping[str, tuple[int, int]]  # file URL -> (done, total) bytes
Reporter = Callable[[ProgressMap], Awaitable[None]]


class DownloadJob:
    def __init__(
        self,
        plan: DownloadPlan,
        cache: Path,
        client: httpx.AsyncClient,
        endpoint: str,
        *,
        journal: Journal | None = None,
        origin: str = "router",
        report: Reporter | None = None,
        policy: RetryPolicy = DEFAULT_POLICY,
        interval: float = 0.1,
    ) -> None:
        self.plan = plan
        self.cache = cache
        self.layout = RepoLayout(cache, plan.repo)
        self.hub = HubClient(client, endpoint)
        self.journal = journal
        self.origin = origin
        self._report = report
        self.policy = policy
        self.interval = interval
        self.urls = {f.path: self.hub.file_url(plan.repo, plan.commit, f.path) for f in plan.files}
        self.progress: dict[str, tuple[int, int]] = {
            self.urls[f.path]: (self.layout.on_disk(f), f.size) for f in plan.files
        }
        self._changed = trio.Event()
        self._failure: BaseException | None = None
        self.finished = False  # every file is in place and linked

    @property
    def done(self) -> int:
        return sum(d for d, _ in self.progress.values())

    @property
    def total(self) -> int:
        return self.plan.total

    def _set(self, f: PlannedFile, done: int) -> None:
        self.progress[self.urls[f.path]] = (done, f.size)
        self._changed.set()

    async def run(self) -> None:
        if self.journal is not None:
            self.journal.add(self.plan, self.origin, self.cache)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reporter)
            limiter = trio.CapacityLimiter(PARALLEL)
            async with trio.open_nursery() as files:
                for f in self.plan.files:
                    files.start_soon(self._one, f, limiter, files.cancel_scope)
            nursery.cancel_scope.cancel()
        if self._failure is not None:
            if self.journal is not None:
                self.journal.remove(self.plan.name)
            raise self._failure
        await trio.to_thread.run_sync(self.layout.finish, self.plan)
        self.finished = True
        if self.journal is not None:
            self.journal.remove(self.plan.name)
        await self._send()
        log.info(
            "downloaded %s (%d files, %d bytes)", self.plan.name, len(self.plan.files), self.total
        )

    async def _one(
        self, f: PlannedFile, limiter: trio.CapacityLimiter, files: trio.CancelScope
    ) -> None:
        if self.layout.have(f):
            self._set(f, f.size)
            return
        try:
            async with limiter:
                url = self.urls[f.path]
                await fetch_file(
                    self.hub.client, url, f, self.layout, lambda n: self._set(f, n), self.policy
                )
        except Exception as exc:  # the first failure ends the job; the others are cancelled
            if self._failure is None:
                self._failure = exc
            files.cancel()
            return
        self._set(f, f.size)

    async def _reporter(self) -> None:
        if self._report is None:
            return
        await self._send()  # the start: every file with what is already on disk
        while True:
            await self._changed.wait()
            await trio.sleep(self.interval)
            await self._send()

    async def _send(self) -> None:
        self._changed = trio.Event()
        if self._report is not None:
            await self._report(dict(self.progress))

    async def discard(self) -> None:
        """After a cancel: delete what this job left (partial files, unlinked blobs) and
        its journal entry (shielded)."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.layout.discard, self.plan)
            if self.journal is not None:
                self.journal.remove(self.plan.name)
