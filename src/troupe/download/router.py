"""The router's downloads (``POST /models``): the hub, the journal, and what follows a job.

* `plan`: what the name means on the hub, asked once when the request arrives (as
  upstream validates, with a network round trip). A hub that refuses or cannot be
  reached is not an HTTP error: the request succeeds and the job reports
  ``download_failed`` with the hub's reason, as upstream reports failures, but with
  the reason (upstream reports success for a repository that does not exist).
* `resume`: at start-up, the journal's router entries resume from the plan they
  recorded (they show as ``downloading`` again); entries for another cache directory,
  or malformed ones, are cleaned (their partial files deleted).

A job that ended is followed by a reload (the scheduler's own), so a finished model
appears under its ``org/repo:TAG`` name and a failed one disappears.

The download child of upstream gets none of the router's command-line arguments, only
its environment: so here ``--no-mmproj`` on the router's command line does not stop the
mmproj download, ``LLAMA_ARG_NO_MMPROJ``/``LLAMA_ARG_MMPROJ_AUTO=0`` in the environment do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import trio

from troupe.catalog.hfcache import cache_dir
from troupe.download.hubapi import HubClient, HubError, hf_endpoint, hf_token, open_client
from troupe.download.journal import Journal
from troupe.download.layout import RepoLayout
from troupe.download.plan import DownloadPlan, PlanError
from troupe.download.spec import DownloadSpec
from troupe.errors import ConfigError
from troupe.sched.snapshot import Snapshot

__all__ = ["RouterDownloads"]

log = logging.getLogger("troupe.download")

PLAN_TIMEOUT = 60.0


class _Scheduler(Protocol):
    @property
    def snapshot(self) -> Snapshot: ...

    async def start_download(
        self, name: str, plan: DownloadPlan | None, error: str = "", error_status: int = 0
    ) -> None: ...


class RouterDownloads:
    def __init__(self, environ: Mapping[str, str], state_dir: Path, token: str | None) -> None:
        self.endpoint = hf_endpoint(environ)
        self.token = hf_token(environ, token)
        try:
            self.cache: Path | None = cache_dir(environ)
        except ConfigError:
            self.cache = None
        self.journal = Journal(state_dir)
        no_mmproj = environ.get("LLAMA_ARG_MMPROJ_AUTO", "").lower() in ("0", "false", "off")
        self.mmproj = not (no_mmproj or "LLAMA_ARG_NO_MMPROJ" in environ)

    def download_spec(
        self, name: str, job: int, plan: DownloadPlan | None, error: str, error_status: int
    ) -> DownloadSpec:
        if self.cache is None:
            plan, error = None, "Failed to determine HF cache directory"
        return DownloadSpec(
            name=name,
            job=job,
            plan=plan,
            cache=self.cache or Path(),
            endpoint=self.endpoint,
            token=self.token,
            journal=self.journal,
            error=error,
            error_status=error_status,
        )

    async def plan(self, name: str) -> tuple[DownloadPlan | None, str, int]:
        """``(plan, "", 0)``, or ``(None, why, hub status)``."""
        try:
            with trio.fail_after(PLAN_TIMEOUT):
                async with open_client(self.token, endpoint=self.endpoint) as client:
                    return (
                        await HubClient(client, self.endpoint).plan(name, mmproj=self.mmproj),
                        "",
                        0,
                    )
        except HubError as exc:
            return None, str(exc), exc.status
        except PlanError as exc:
            return None, str(exc), 404
        except trio.TooSlowError:
            return None, f"{name}: the hub did not answer within {PLAN_TIMEOUT:g}s", 0

    async def resume(self, scheduler: _Scheduler) -> None:
        """Start-up: resume the router's unfinished downloads, clean what cannot be."""
        self.journal.clean()
        for entry in self.journal.entries():
            if entry.origin != "router":
                continue  # a paused `troupe pull`: its own next run resumes it
            if self.cache is None or entry.cache != str(self.cache):
                log.info("dropping the unfinished download of %s (another cache)", entry.plan.name)
                await trio.to_thread.run_sync(
                    RepoLayout(Path(entry.cache), entry.plan.repo).discard, entry.plan
                )
                self.journal.remove(entry.plan.name)
                continue
            log.info("resuming the unfinished download of %s", entry.plan.name)
            try:
                await scheduler.start_download(entry.plan.name, entry.plan)
            except Exception as exc:  # ModelUnavailable: the name exists by now
                log.warning("cannot resume %s: %s", entry.plan.name, exc)
                self.journal.remove(entry.plan.name)
