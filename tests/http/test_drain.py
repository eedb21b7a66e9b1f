"""Fair admission over HTTP: models that are never idle do not starve a third one.

Two models are kept busy (the fake engine generates slowly: one long stream on each,
plus clients that always send the next request); with --models-max 2 upstream makes
the third model wait until one of them happens to be idle, which here is never.
"""

from __future__ import annotations

import httpx
import trio

from troupe.sched import Status
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
        stop, codes = trio.Event(), []
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
