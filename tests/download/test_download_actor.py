"""The download actor: exactly one outcome message, whatever happens inside the job."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from troupe.actors.download import DownloadActor, DownloadSpec
from troupe.download.hubapi import HubClient, open_client
from troupe.download.job import DownloadJob
from troupe.download.journal import Journal
from troupe.download.plan import DownloadPlan
from troupe.download.transfer import RetryPolicy
from troupe.messages import DownloadFailed, DownloadFinished, DownloadProgress, Message
from troupe_rig.hub import Fault, Hub

MODEL = "m-Q4_K_M.gguf"


async def plan_of(hub: Hub, name: str) -> DownloadPlan:
    async with open_client() as client:
        return await HubClient(client, hub.url).plan(name)


def spec(hub: Hub, plan: DownloadPlan | None, tmp_path: Path, **kw: object) -> DownloadSpec:
    return DownloadSpec(
        name=plan.name if plan else "org/x",
        job=7,
        plan=plan,
        cache=tmp_path / "cache",
        endpoint=hub.url,
        journal=Journal(tmp_path / "state"),
        policy=RetryPolicy(attempts=2, backoff=0.01),
        **kw,  # type: ignore[arg-type]
    )


async def run_actor(actor: DownloadActor, send: trio.MemorySendChannel[Message]) -> None:
    async with send:
        await actor.run()


async def messages_of(spec: DownloadSpec) -> list[Message]:
    send, recv = trio.open_memory_channel[Message](100)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_actor, DownloadActor(spec, send.clone()), send)
        return [m async for m in recv]


async def test_progress_then_finished_with_the_listed_name(
    hub: Hub, repo: str, tmp_path: Path
) -> None:
    plan = await plan_of(hub, repo)
    got = await messages_of(spec(hub, plan, tmp_path))
    *progress, outcome = got
    assert outcome == DownloadFinished(repo, 7, f"{repo}:Q4_K_M")
    assert progress
    assert all(isinstance(m, DownloadProgress) for m in progress)
    last = progress[-1]
    assert isinstance(last, DownloadProgress)
    assert {url.rsplit("/", 1)[-1] for url in last.progress} == {MODEL, "mmproj-m-F16.gguf"}
    assert all(done == total > 0 for done, total in last.progress.values())


async def test_a_failed_plan_is_one_failure_with_the_hub_status(hub: Hub, tmp_path: Path) -> None:
    got = await messages_of(
        spec(hub, None, tmp_path, error="404 Repository not found", error_status=404)
    )
    assert got == [DownloadFailed("org/x", 7, "404 Repository not found", 404)]


async def test_a_bug_in_the_job_is_a_failure_not_an_exception(
    hub: Hub, repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: DownloadJob) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(DownloadJob, "run", broken)
    plan = await plan_of(hub, repo)
    (outcome,) = await messages_of(spec(hub, plan, tmp_path))
    assert isinstance(outcome, DownloadFailed)
    assert "troupe download error" in outcome.reason
    assert "boom" in outcome.reason


async def test_a_stalled_job_fails_and_forgets_its_journal_entry(
    hub: Hub, repo: str, tmp_path: Path
) -> None:
    hub.fault(repo, MODEL, Fault(stall_at=10_000))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    s = spec(hub, plan, tmp_path, stall_timeout=0.5)
    *_, outcome = await messages_of(s)
    assert isinstance(outcome, DownloadFailed)
    assert outcome.reason.startswith("stalled")
    assert not outcome.cancelled
    assert s.journal is not None
    assert s.journal.entries() == []


async def test_cancel_discards_or_keeps_as_asked(hub: Hub, repo: str, tmp_path: Path) -> None:
    hub.fault(repo, MODEL, Fault(stall_at=10_000))
    plan = await plan_of(hub, f"{repo}:Q4_K_M")
    for discard in (False, True):
        s = spec(hub, plan, tmp_path)
        send, recv = trio.open_memory_channel[Message](100)
        actor = DownloadActor(s, send.clone())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_actor, actor, send)
            async for m in recv:  # until bytes arrived: the job is under way
                assert isinstance(m, DownloadProgress)
                if any(done for done, _ in m.progress.values()):
                    break
            actor.cancel(discard=discard)
            rest = [m async for m in recv]
        assert isinstance(rest[-1], DownloadFailed)
        assert rest[-1].cancelled
        partial = list((tmp_path / "cache").rglob("*.downloadInProgress"))
        assert s.journal is not None
        assert bool(partial) is not discard
        assert [e.plan for e in s.journal.entries()] == ([] if discard else [plan])
