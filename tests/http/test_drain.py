"""Fair admission over HTTP: models that are never idle do not starve a third one.

Two models are kept busy (the fake engine generates slowly: one long stream on each,
plus clients that always send the next request); with --models-max 2 upstream makes
the third model wait until one of them happens to be idle, which here is never.
"""

from __future__ import annotations

import collections
from typing import Any

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from troupe.sched import Snapshot, Status
from troupe_rig.router import RouterFactory, RunningRouter

SLOW = {"fake-tps": "50", "fake-tokens": "10"}  # a short request: a fifth of a second


async def hold(http: httpx.AsyncClient, model: str, tokens: int) -> None:
    """One streamed request of ``tokens`` tokens (50 a second)."""
    body = {"model": model, "prompt": "x", "stream": True, "n_predict": tokens}
    async with http.stream("POST", "/completion", json=body) as resp:
        assert resp.status_code == 200
        async for _ in resp.aiter_bytes():
            pass


async def keep_busy(
    http: httpx.AsyncClient, model: str, stop: trio.Event, codes: list[int]
) -> None:
    while not stop.is_set():
        resp = await http.post("/completion", json={"model": model, "prompt": "x"})
        codes.append(resp.status_code)


async def settled_apart(router: RunningRouter) -> None:
    """a and b loaded, each on its own lane. With CPU placement a, started alone on every
    core, is started again narrower once b is loaded beside it; the test's drain must be
    the one c causes, so the busy load starts after that re-plan."""

    def apart(s: Snapshot) -> bool:
        views = [s.models[m] for m in ("a", "b")]
        if any(v.status is not Status.LOADED or v.stopping or v.draining_for for v in views):
            return False
        a, b = (v.cpu for v in views)
        return a is None or b is None or set(a.cpus).isdisjoint(b.cpus)

    for model in ("a", "b"):
        await router.ctx.scheduler.load(model)
        await router.wait_for_status(model, Status.LOADED)
    with trio.fail_after(20):
        await router.ctx.scheduler.wait_until(apart)


async def both_busy(router: RunningRouter) -> None:
    await router.ctx.scheduler.wait_until(
        lambda s: s.models["a"].in_flight > 0 and s.models["b"].in_flight > 0
    )


async def test_a_model_that_starves_behind_busy_ones_is_served_after_the_drain(
    fake_router: RouterFactory,
) -> None:
    sections = {"a": SLOW, "b": SLOW, "c": {}}
    async with (
        fake_router(sections, "--models-max", "2", "--drain-after", "0.5") as router,
        router.client() as http,
    ):
        await settled_apart(router)
        stop, codes = trio.Event(), list[int]()
        async with trio.open_nursery() as nursery:
            for model in ("a", "b"):
                nursery.start_soon(hold, http, model, 150)  # 3 s: busy when c arrives
                for _ in range(2):
                    nursery.start_soon(keep_busy, http, model, stop, codes)
            await both_busy(router)
            with router.ctx.scheduler.subscribe() as events, trio.fail_after(20):
                resp = await http.post("/completion", json={"model": "c", "prompt": "x"})
                assert resp.status_code == 200, resp.text
                seen = [e async for e in _until_evict(events)]
            stop.set()
        assert seen[0]["event"] == "troupe_drain"
        assert seen[0]["data"]["for"] == "c"
        assert seen[-1]["data"] == {"reason": "drain for c", "kind": "drain"}  # once idle
        assert set(codes) == {200}  # the drained model's requests waited, none failed


async def _until_evict(events: trio.MemoryReceiveChannel[dict]):  # type: ignore[type-arg]
    async for event in events:
        if event["event"] in ("troupe_drain", "troupe_evict"):
            yield event
            if event["event"] == "troupe_evict":
                return


async def test_with_drain_after_off_busy_models_keep_their_slots_as_upstream(
    fake_router: RouterFactory,
) -> None:
    sections = {"a": SLOW, "b": SLOW, "c": {}}
    async with (
        fake_router(sections, "--models-max", "2", "--drain-after", "off") as router,
        router.client() as http,
        trio.open_nursery() as nursery,
    ):
        for model in ("a", "b"):
            nursery.start_soon(hold, http, model, 1000)  # 20 s
        await both_busy(router)
        with trio.move_on_after(2):  # upstream: c waits while a and b stay busy
            await http.post("/completion", json={"model": "c", "prompt": "x"})
            raise AssertionError("c was served although a and b never went idle")
        await router.ctx.scheduler.wait_until(lambda s: s.models["c"].waiting == 0)
        assert router.snapshot.models["c"].status is Status.UNLOADED
        nursery.cancel_scope.cancel()


async def test_a_drain_and_an_unload_are_counted_by_their_reason_on_metrics(
    fake_router: RouterFactory,
) -> None:
    """What a Prometheus server reads (its client library's own parser): every stop the
    SSE stream announced, counted under its reason; the drain's eviction as "drain" (it
    used to be "other") and an unload among the stops (it used to be counted nowhere)."""
    sections = {"a": SLOW, "b": SLOW, "c": {}}
    async with (
        fake_router(sections, "--models-max", "2", "--drain-after", "0.5") as router,
        router.client() as http,
    ):
        seen: list[dict[str, Any]] = []
        unloaded = trio.Event()

        async def collect(events: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
            async for event in events:
                seen.append(event)
                gone = event["event"] == "status_change" and event["data"]["status"] == "unloaded"
                if gone and event["model"] == up:
                    unloaded.set()

        up = ""
        with router.ctx.scheduler.subscribe() as events:
            async with trio.open_nursery() as watching:
                watching.start_soon(collect, events)
                await settled_apart(router)
                stop, codes = trio.Event(), list[int]()
                async with trio.open_nursery() as nursery:
                    for model in ("a", "b"):
                        nursery.start_soon(hold, http, model, 150)
                        for _ in range(2):
                            nursery.start_soon(keep_busy, http, model, stop, codes)
                    await both_busy(router)
                    with trio.fail_after(20):
                        resp = await http.post("/completion", json={"model": "c", "prompt": "x"})
                    assert resp.status_code == 200, resp.text
                    stop.set()
                models = router.snapshot.models
                up = next(n for n, m in models.items() if m.status is Status.LOADED)
                assert (await http.post("/models/unload", json={"model": up})).status_code == 200
                with trio.fail_after(20):
                    await unloaded.wait()
                watching.cancel_scope.cancel()
        resp = await http.get("/metrics")
    assert resp.status_code == 200
    said = collections.Counter(
        (e["event"], e["model"], e["data"]["kind"])
        for e in seen
        if e["event"] in ("troupe_evict", "troupe_stop")
    )
    assert said[("troupe_evict", drained_for(seen, "c"), "drain")] == 1
    assert said[("troupe_stop", up, "unload")] == 1
    counted = collections.Counter(
        {
            (s.name, s.labels["model"], s.labels["reason"]): int(s.value)
            for family in text_string_to_metric_families(resp.text)
            for s in family.samples
            if s.name in ("troupe_model_evictions_total", "troupe_model_stops_total")
        }
    )
    evictions = {("troupe_model_evictions_total", m, k): n for (e, m, k), n in said.items()
                 if e == "troupe_evict"}  # fmt: skip
    stops = {("troupe_model_stops_total", m, k): n for (_, m, k), n in said.items()}
    assert counted == collections.Counter({**evictions, **stops})


def drained_for(seen: list[dict[str, Any]], model: str) -> str:
    (drain,) = [e for e in seen if e["event"] == "troupe_drain" and e["data"]["for"] == model]
    return str(drain["model"])
