"""A download job against the loopback hub: resume, verification, retries, cancellation.

Real sockets and real files; every fault is injected by the hub (`troupe_rig.hub`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import huggingface_hub
import pytest
import trio

from troupe.catalog.hfcache import cached_files, cached_models
from troupe.download.hubapi import HubClient, HubError, open_client
from troupe.download.job import DownloadJob, ProgressMap, Reporter
from troupe.download.journal import Journal
from troupe.download.layout import PARTIAL_SUFFIX, RepoLayout
from troupe.download.plan import DownloadPlan, PlanError
from troupe.download.transfer import BusyError, ChecksumError, RetryPolicy
from troupe_rig.hub import Fault, Hub

FAST = RetryPolicy(attempts=3, backoff=0.01, backoff_max=0.05)
MODEL = "m-Q4_K_M.gguf"


async def plan_of(hub: Hub, name: str, token: str = "") -> DownloadPlan:
    async with open_client(token, endpoint=hub.url) as client:
        return await HubClient(client, hub.url).plan(name)


def reached(job_file: str, at_least: int) -> tuple[trio.Event, Reporter]:
    """An event set once a job's report shows ``at_least`` bytes of ``job_file``."""
    event = trio.Event()

    async def report(progress: ProgressMap) -> None:
        if any(url.endswith(job_file) and done >= at_least for url, (done, _) in progress.items()):
            event.set()

    return event, report


async def run_job(
    hub: Hub, plan: DownloadPlan, cache: Path, journal: Journal | None = None, token: str = ""
) -> DownloadJob:
    async with open_client(token, endpoint=hub.url) as client:
        job = DownloadJob(plan, cache, client, hub.url, journal=journal, policy=FAST)
        await job.run()
    return job


def partials(cache: Path) -> list[Path]:
    return sorted(cache.rglob(f"*{PARTIAL_SUFFIX}"))


def snapshot_files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("models--*/snapshots/*/**/*") if not p.is_dir())


async def test_a_download_lands_where_troupe_and_huggingface_hub_both_find_it(
    hub: Hub, repo: str, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    assert [(f.path, f.role) for f in plan.files] == [
        (MODEL, "model"),
        ("mmproj-m-F16.gguf", "mmproj"),
    ]
    await run_job(hub, plan, cache)
    assert cached_models(cache) == [f"{repo}:Q4_K_M"]
    local = {f.path: f.local_path for f in cached_files(cache, repo)}
    assert local[MODEL].read_bytes() == tiny_files[MODEL].read_bytes()
    assert local[MODEL].is_symlink()  # into blobs/<sha256>, as HF lays it out
    # huggingface_hub's own scan sees a clean repository: no warnings, the right files.
    info = huggingface_hub.scan_cache_dir(cache)
    assert info.warnings == []
    (cached,) = info.repos
    assert cached.repo_id == repo
    (rev,) = cached.revisions
    assert rev.refs == frozenset({"main"})
    assert rev.commit_hash == plan.commit
    sha = hashlib.sha256(tiny_files[MODEL].read_bytes()).hexdigest()
    assert {(f.file_name, f.blob_path.name) for f in rev.files} >= {(MODEL, sha)}
    assert partials(cache) == []


async def test_a_connection_dropped_halfway_resumes_with_range_and_verifies(
    hub: Hub, repo: str, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    size = tiny_files[MODEL].stat().st_size
    hub.fault(repo, MODEL, Fault(drop_at=size // 2, drops=2))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    await run_job(hub, plan, tmp_path / "cache")
    gets = hub.gets(MODEL)
    assert (gets[0].range, gets[0].sent) == (None, size // 2)
    assert (gets[1].range, gets[1].status) == (f"bytes={size // 2}-", 206)
    assert hub.sent(MODEL) == size  # not one byte fetched twice
    assert (tmp_path / "cache").rglob(MODEL)


async def test_a_wrong_checksum_fails_and_leaves_no_file_behind(
    hub: Hub, repo: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    hub.add_repo("org/one", {MODEL: hub.repos[repo].files[MODEL]})
    hub.fault("org/one", MODEL, Fault(corrupt=True))
    plan = await plan_of(hub, "org/one")
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        await run_job(hub, plan, cache)
    assert snapshot_files(cache) == []
    assert partials(cache) == []
    assert not RepoLayout(cache, "org/one").have(plan.files[0])
    assert cached_models(cache) == []


async def test_a_server_that_ignores_range_is_read_from_the_start(
    hub: Hub, repo: str, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    size = tiny_files[MODEL].stat().st_size
    hub.fault(repo, MODEL, Fault(drop_at=size // 3, ignore_range=True))
    await run_job(hub, await plan_of(hub, f"{repo}:Q4_K_M"), tmp_path / "cache")
    gets = hub.gets(MODEL)
    assert [g.status for g in gets] == [200, 200]
    assert gets[1].range is not None  # it was asked for, and ignored
    assert cached_models(tmp_path / "cache") == [f"{repo}:Q4_K_M"]


async def test_a_paused_job_keeps_its_bytes_and_the_next_one_resumes(
    hub: Hub, repo: str, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    cache, journal = tmp_path / "cache", Journal(tmp_path / "state")
    size = tiny_files[MODEL].stat().st_size
    hub.fault(repo, MODEL, Fault(stall_at=size // 2))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    async with open_client() as client:
        half, report = reached(MODEL, size // 2)
        job = DownloadJob(plan, cache, client, hub.url, journal=journal, report=report)
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(job.run)
                await half.wait()
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
    (kept,) = [p for p in partials(cache) if p.name.startswith(plan.files[0].oid)]
    assert kept.stat().st_size == size // 2
    assert [e.plan for e in journal.entries()] == [plan]
    hub.fault(repo, MODEL, None)
    reports: list[ProgressMap] = []

    async def keep(progress: ProgressMap) -> None:
        reports.append(progress)

    async with open_client() as client:
        resumed = DownloadJob(
            journal.entries()[0].plan, cache, client, hub.url, journal=journal, report=keep
        )
        await resumed.run()
    # The first report already counts what was on disk (a resumed bar starts at 50%).
    first = {url.rsplit("/", 1)[-1]: done for url, (done, _) in reports[0].items()}
    assert first[MODEL] == size // 2
    assert hub.gets(MODEL)[-1].range == f"bytes={size // 2}-"
    assert journal.entries() == []
    assert cached_models(cache) == [f"{repo}:Q4_K_M"]


async def test_discard_removes_partials_journal_and_empty_folders(
    hub: Hub, repo: str, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    cache, journal = tmp_path / "cache", Journal(tmp_path / "state")
    hub.fault(repo, MODEL, Fault(stall_at=1000))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    async with open_client() as client:
        job = DownloadJob(plan, cache, client, hub.url, journal=journal)
        with trio.move_on_after(0.5):
            await job.run()
        await job.discard()
    assert journal.entries() == []
    assert not (cache / "models--org--tiny").exists()


async def test_transient_errors_are_retried_and_permanent_ones_are_not(
    hub: Hub, repo: str, tmp_path: Path
) -> None:
    hub.fault(repo, MODEL, Fault(status=503, times=2))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    await run_job(hub, plan, tmp_path / "a")
    assert [g.status for g in hub.gets(MODEL)] == [503, 503, 200]
    hub.fault(repo, MODEL, Fault(status=503))
    with pytest.raises(HubError, match=r"gave up after 3 attempts"):
        await run_job(hub, plan, tmp_path / "b")
    hub.fault(repo, MODEL, Fault(status=403))
    with pytest.raises(HubError, match="403") as info:
        await run_job(hub, plan, tmp_path / "c")
    assert info.value.status == 403


async def test_unknown_repos_and_tags_and_private_repos(hub: Hub, repo: str) -> None:
    with pytest.raises(HubError, match="404 Repository not found") as info:
        await plan_of(hub, "org/missing")
    assert info.value.status == 404
    with pytest.raises(PlanError, match="no GGUF file with tag 'Q2_K'"):
        await plan_of(hub, f"{repo}:Q2_K")
    hub.add_repo("org/private", {MODEL: hub.repos[repo].files[MODEL]}, private=True)
    with pytest.raises(HubError, match="401") as info:
        await plan_of(hub, "org/private")
    assert info.value.status == 401
    plan = await plan_of(hub, "org/private", token=hub.token)
    assert [f.path for f in plan.files] == [MODEL]


async def test_two_jobs_never_append_to_one_partial_file(
    hub: Hub, repo: str, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    hub.fault(repo, MODEL, Fault(stall_at=1000))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    async with open_client() as client, trio.open_nursery() as nursery:
        started, report = reached(MODEL, 1)
        first = DownloadJob(plan, cache, client, hub.url, report=report)
        nursery.start_soon(first.run)
        await started.wait()
        with pytest.raises(BusyError, match="another process"):
            await DownloadJob(plan, cache, client, hub.url, policy=FAST).run()
        nursery.cancel_scope.cancel()


async def test_a_file_huggingface_hub_downloaded_is_not_fetched_again(
    hub: Hub, repo: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    await trio.to_thread.run_sync(
        lambda: huggingface_hub.hf_hub_download(
            repo, MODEL, cache_dir=cache, endpoint=hub.url.rstrip("/")
        )
    )
    before = len(hub.gets(MODEL))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    await run_job(hub, plan, cache)
    assert len(hub.gets(MODEL)) == before  # the blob was there, named by its sha256
    assert cached_models(cache) == [f"{repo}:Q4_K_M"]
