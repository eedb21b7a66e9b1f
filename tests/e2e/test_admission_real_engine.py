"""Admission and eviction against the real llama-server, end to end.

``LLAMA_SERVER_DEBUG_FAKE_TIMING`` (upstream's debug hook) holds every proxied request busy for
2 s, and delays every load by 2 s, exactly as the C++ router does for its own tests:
that window is where the queueing is observed. Every wait below is on a scheduler
event, never on a clock.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from troupe.sched import Snapshot, Status
from troupe_rig.events import drain
from troupe_rig.router import RunningRouter, open_router

pytestmark = pytest.mark.engine

CHILD_ARGS = ("--ctx-size", "256", "--parallel", "2")


@asynccontextmanager
async def router_for(
    engine: Path,
    models: Path,
    tmp_path: Path,
    *args: str,
    fake_timing: bool = True,
    preset: str | None = None,
) -> AsyncIterator[RunningRouter]:
    env = dict(os.environ)
    if fake_timing:
        env["LLAMA_SERVER_DEBUG_FAKE_TIMING"] = "1"
    extra = ["--models-preset", preset] if preset else []
    # Upstream's admission exactly: no drain of busy models for a starving one (the
    # drain has tests of its own).
    if "--drain-after" not in args:
        extra += ["--drain-after", "off"]
    async with open_router(
        ["--models-dir", str(models), *CHILD_ARGS, *extra, *args],
        engine=engine,
        state_dir=tmp_path / "state",
        cwd=tmp_path,
        environ=env,
    ) as router:
        yield router


async def complete(http: httpx.AsyncClient, model: str, results: list[tuple[str, int]]) -> None:
    resp = await http.post("/completion", json={"model": model, "prompt": "hi", "n_predict": 2})
    results.append((model, resp.status_code))


def waiting(model: str, n: int = 1) -> Callable[[Snapshot], bool]:
    return lambda s: model in s.models and s.models[model].waiting >= n


async def loaded(router: RunningRouter, model: str) -> None:
    await router.ctx.scheduler.load(model)
    await router.wait_for_status(model, Status.LOADED)


async def start_busy(
    nursery: trio.Nursery,
    router: RunningRouter,
    http: httpx.AsyncClient,
    model: str,
    results: list[tuple[str, int]],
) -> None:
    """A request to ``model`` that is in flight when this returns (held 2 s by fake timing)."""
    nursery.start_soon(complete, http, model, results)
    await router.ctx.scheduler.wait_until(lambda s: s.models[model].in_flight >= 1)


async def test_b_waits_while_a_serves_and_both_succeed(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        router_for(engine_path, tiny_model_dir, tmp_path, "--models-max", "1") as router,
        router.client() as http,
    ):
        sched = router.ctx.scheduler
        await loaded(router, "tiny-a")
        results: list[tuple[str, int]] = []
        with sched.subscribe() as events:
            async with trio.open_nursery() as nursery:
                await start_busy(nursery, router, http, "tiny-a", results)
                nursery.start_soon(complete, http, "tiny-b", results)
                snap: Snapshot = await sched.wait_until(waiting("tiny-b"))
                assert snap.models["tiny-a"].status is Status.LOADED  # not evicted while busy
                assert not snap.models["tiny-a"].stopping
            evictions = []
            for event in drain(events):
                if event["event"] == "troupe_evict":
                    evictions.append((event["model"], event["data"]["reason"]))
        assert sorted(results) == [("tiny-a", 200), ("tiny-b", 200)]
        assert results[0][0] == "tiny-a"  # a finished before b could start
        assert evictions == [("tiny-a", "lru for tiny-b")]


async def test_three_requests_for_a_missing_model_one_load_one_eviction(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        router_for(
            engine_path, tiny_model_dir, tmp_path, "--models-max", "1", fake_timing=False
        ) as router,
        router.client() as http,
    ):
        sched = router.ctx.scheduler
        await loaded(router, "tiny-a")
        results: list[tuple[str, int]] = []
        with sched.subscribe() as events:
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(complete, http, "tiny-b", results)
            seen = drain(events)
        assert results == [("tiny-b", 200)] * 3
        loads = [e for e in seen if e["event"] == "model_status" and e["model"] == "tiny-b"]
        evicts = [e for e in seen if e["event"] == "troupe_evict"]
        assert len(loads) == 1
        assert [e["model"] for e in evicts] == ["tiny-a"]


async def test_a_queued_client_that_gives_up_costs_no_model_its_place(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        router_for(engine_path, tiny_model_dir, tmp_path, "--models-max", "1") as router,
        router.client() as http,
    ):
        sched = router.ctx.scheduler
        await loaded(router, "tiny-a")
        results: list[tuple[str, int]] = []
        async with trio.open_nursery() as nursery:
            await start_busy(nursery, router, http, "tiny-a", results)
            async with trio.open_nursery() as impatient:
                impatient.start_soon(complete, http, "tiny-b", results)
                await sched.wait_until(waiting("tiny-b"))
                impatient.cancel_scope.cancel()  # the client gives up while queued
            await sched.wait_until(lambda s: s.models["tiny-b"].waiting == 0)
        assert results == [("tiny-a", 200)]
        snap = sched.snapshot
        assert snap.models["tiny-a"].status is Status.LOADED
        assert snap.models["tiny-a"].last_eviction is None
        assert snap.models["tiny-b"].status is Status.UNLOADED


async def test_two_models_queued_behind_a_busy_one_load_in_arrival_order(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        router_for(engine_path, tiny_model_dir, tmp_path, "--models-max", "1") as router,
        router.client() as http,
    ):
        sched = router.ctx.scheduler
        await loaded(router, "tiny-a")
        results: list[tuple[str, int]] = []
        with sched.subscribe() as events:
            async with trio.open_nursery() as nursery:
                await start_busy(nursery, router, http, "tiny-a", results)
                nursery.start_soon(complete, http, "tiny-c", results)
                await sched.wait_until(waiting("tiny-c"))
                nursery.start_soon(complete, http, "tiny-b", results)
                snap = await sched.wait_until(waiting("tiny-b"))
                assert snap.models["tiny-c"].queue_position == 1
                assert snap.models["tiny-b"].queue_position == 2
            order = []
            for event in drain(events):
                if event["event"] == "model_status":
                    order.append(event["model"])
        assert order == ["tiny-c", "tiny-b"]
        assert sorted(results) == [("tiny-a", 200), ("tiny-b", 200), ("tiny-c", 200)]


async def test_two_waiters_for_the_same_idle_model_are_both_served(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        router_for(
            engine_path, tiny_model_dir, tmp_path, "--models-max", "1", fake_timing=False
        ) as router,
        router.client() as http,
    ):
        await loaded(router, "tiny-a")
        results: list[tuple[str, int]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, http, "tiny-a", results)
            nursery.start_soon(complete, http, "tiny-a", results)
        assert results == [("tiny-a", 200)] * 2
        assert router.snapshot.models["tiny-a"].last_eviction is None


async def test_a_pinned_model_survives_pressure(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    preset = tmp_path / "pins.ini"
    preset.write_text("[tiny-a]\npin = true\n")
    async with (
        router_for(
            engine_path,
            tiny_model_dir,
            tmp_path,
            "--models-max",
            "2",
            fake_timing=False,
            preset=str(preset),
        ) as router,
        router.client() as http,
    ):
        results: list[tuple[str, int]] = []
        await complete(http, "tiny-a", results)  # least recently used, but pinned
        await complete(http, "tiny-b", results)
        await complete(http, "tiny-c", results)  # needs a slot: b goes, a stays
        assert results == [("tiny-a", 200), ("tiny-b", 200), ("tiny-c", 200)]
        snap = router.snapshot
        assert snap.models["tiny-a"].status is Status.LOADED
        assert snap.models["tiny-b"].last_eviction == "lru for tiny-c"


async def test_ttl_unloads_an_idle_model_but_never_during_a_request(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    preset = tmp_path / "ttl.ini"
    preset.write_text("[tiny-a]\nttl = 1\n")
    async with (
        router_for(engine_path, tiny_model_dir, tmp_path, preset=str(preset)) as router,
        router.client() as http,
    ):
        # With fake timing each request is held busy for 2 s: longer than the TTL.
        results: list[tuple[str, int]] = []
        sched = router.ctx.scheduler
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, http, "tiny-a", results)
            snap = await sched.wait_until(lambda s: s.models["tiny-a"].in_flight == 1)
            assert snap.models["tiny-a"].status is Status.LOADED
            # The state as the request ended (not as this task next runs: the TTL may
            # have run out by then on a loaded machine).
            snap = await sched.wait_until(lambda s: s.models["tiny-a"].in_flight == 0)
        assert results == [("tiny-a", 200)]
        assert snap.models["tiny-a"].status is Status.LOADED  # the request outlived the TTL
        assert snap.models["tiny-a"].last_eviction is None
        snap = await router.wait_for_status("tiny-a", Status.UNLOADED, within=60)
        assert snap.models["tiny-a"].last_eviction == "ttl"
        assert snap.models["tiny-a"].exit_code == 0


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "upstream"])
async def test_a_swap_starts_the_next_child_while_the_victim_exits_when_memory_allows(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path, fair: bool
) -> None:
    # Fair admission with memory admission: the next model starts on a reading that still
    # counts the victim, without waiting for its exit; upstream (--drain-after off) waits.
    drain_after = "1" if fair else "off"
    async with (
        router_for(
            engine_path,
            tiny_model_dir,
            tmp_path,
            "--models-max",
            "1",
            "--drain-after",
            drain_after,
            fake_timing=False,
        ) as router,
        router.client() as http,
    ):
        sched = router.ctx.scheduler
        results: list[tuple[str, int]] = []
        for model in ("tiny-b", "tiny-a"):  # each measured by the engine, then loaded
            await complete(http, model, results)
        assert all(sched.snapshot.models[m].memory_source == "engine" for m in ("tiny-a", "tiny-b"))
        with sched.subscribe() as events:
            await complete(http, "tiny-b", results)
            await router.wait_for_status("tiny-a", Status.UNLOADED)
            seen = [
                (e["model"], e["event"], (e.get("data") or {}).get("status")) for e in drain(events)
            ]
        assert results == [("tiny-b", 200), ("tiny-a", 200), ("tiny-b", 200)]
        b_loading = seen.index(("tiny-b", "model_status", "loading"))
        a_gone = seen.index(("tiny-a", "status_change", "unloaded"))
        assert (b_loading < a_gone) is fair, seen
        resp = await http.post("/completion", json={"model": "tiny-b", "prompt": "hi"})
        assert resp.status_code == 200
