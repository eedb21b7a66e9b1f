"""The download actor: one download job under the scheduler (one_for_one).

Whatever happens inside the job (the hub refuses, a checksum fails, the job stalls, a
bug in troupe's code), the actor ends with exactly one message, `DownloadFinished` or
`DownloadFailed`, and never raises into the scheduler's nursery. Progress goes out as
`DownloadProgress` (the cumulative per-URL map, at most every 100 ms).

`cancel` (from the scheduler, never blocks) ends the job at its next checkpoint: the
network side stops at once, disk work within one step (1 MiB written, 64 MiB hashed),
so well within a second. ``discard=True`` (an unload or a ``DELETE``) deletes the
partial files and the journal entry; ``discard=False`` (the router shutting down) keeps
both, and the next start resumes from the journal.
"""

from __future__ import annotations

import logging

import trio

from troupe.download.hubapi import HubError, open_client
from troupe.download.job import DownloadJob, ProgressMap
from troupe.download.plan import PlanError
from troupe.download.spec import DownloadSpec
from troupe.download.transfer import BusyError, ChecksumError
from troupe.messages import DownloadFailed, DownloadFinished, DownloadProgress, Message
from troupe.modellog import about

__all__ = ["DownloadActor", "DownloadSpec"]

log = logging.getLogger("troupe.download")


class DownloadActor:
    def __init__(self, spec: DownloadSpec, outbox: trio.MemorySendChannel[Message]) -> None:
        self.spec = spec
        self._outbox = outbox
        self._scope = trio.CancelScope()
        self._discard = False
        self._cancelled = False
        self.job: DownloadJob | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def cancel(self, *, discard: bool = True) -> None:
        self._cancelled = True
        self._discard = self._discard or discard
        self._scope.cancel()

    async def run(self) -> None:
        """Run the job; always ends with exactly one outcome message."""
        async with self._outbox:
            outcome: Message
            with self._scope:
                outcome = await self._outcome()
            if self._scope.cancelled_caught or self._cancelled:
                if self._discard and self.job is not None:
                    await self.job.discard()
                outcome = DownloadFailed(self.name, self.spec.job, "cancelled", cancelled=True)
            with trio.CancelScope(shield=True):
                await self._outbox.send(outcome)

    async def _outcome(self) -> Message:
        spec = self.spec
        if spec.plan is None:
            return self._failed(spec.error, spec.error_status)
        try:
            async with open_client(spec.token, endpoint=spec.endpoint) as client:
                self.job = DownloadJob(
                    spec.plan,
                    spec.cache,
                    client,
                    spec.endpoint,
                    journal=spec.journal,
                    report=self._report,
                    policy=spec.policy,
                )
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watchdog, self.job, nursery.cancel_scope)
                    await self.job.run()
                    nursery.cancel_scope.cancel()
                if not self.job.finished:  # the watchdog stopped it
                    if spec.journal is not None:
                        spec.journal.remove(spec.name)
                    return self._failed(f"stalled: no progress for {spec.stall_timeout:g}s", 0)
            return DownloadFinished(spec.name, spec.job, spec.plan.listed_name)
        except HubError as exc:
            return self._failed(str(exc), exc.status)
        except (PlanError, ChecksumError, BusyError) as exc:
            return self._failed(str(exc), 0)
        except OSError as exc:
            return self._failed(f"cannot write the cache: {exc}", 0)
        except Exception as exc:  # a bug in the job is this download's failure only
            about(log, spec.name).exception("download actor failed")
            return self._failed(f"troupe download error: {exc!r}", 0)

    def _failed(self, reason: str, status: int) -> DownloadFailed:
        about(log, self.name).warning("download failed: %s", reason)
        return DownloadFailed(self.name, self.spec.job, reason, status)

    async def _report(self, progress: ProgressMap) -> None:
        await self._outbox.send(DownloadProgress(self.name, self.spec.job, progress))

    async def _watchdog(self, job: DownloadJob, scope: trio.CancelScope) -> None:
        """A job whose byte count has not moved for ``stall_timeout`` is stopped; httpx's
        read timeout and the retry policy normally end it first."""
        last = -1
        while True:
            await trio.sleep(self.spec.stall_timeout)
            if job.done == last:
                scope.cancel()
                return
            last = job.done
