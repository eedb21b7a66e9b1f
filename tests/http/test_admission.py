"""--queue-max, --queue-timeout and the queue/eviction events, over HTTP (fake engine)."""

from __future__ import annotations

import httpx
import trio

from troupe.sched import Status
from troupe_rig.events import drain
from troupe_rig.router import RouterFactory


async def test_queue_max_answers_503_with_retry_after(fake_router: RouterFactory) -> None:
    sections = {"a": {"fake-load-time": "30"}, "b": {}}
    async with fake_router(sections, "--queue-max", "1") as router, router.client() as http:
        results: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                results.append(await http.post("/completion", json={"model": "a", "prompt": "x"}))

            nursery.start_soon(first)
            await router.ctx.scheduler.wait_until(
                lambda s: len(s.queue) == 1 or s.models["a"].waiting == 1
            )
            resp = await http.post("/completion", json={"model": "b", "prompt": "x"})
            assert resp.status_code == 503
            assert resp.json()["error"]["type"] == "unavailable_error"
            assert "--queue-max 1" in resp.json()["error"]["message"]
            assert int(resp.headers["retry-after"]) >= 1
            nursery.cancel_scope.cancel()


async def test_queue_timeout_bounds_the_wait(fake_router: RouterFactory) -> None:
    sections = {"slow": {"fake-load-time": "30"}}
    async with fake_router(sections, "--queue-timeout", "0.5") as router, router.client() as http:
        resp = await http.post("/completion", json={"model": "slow", "prompt": "x"})
        assert resp.status_code == 503
        assert "timed out after 0.5 s waiting for model slow" in resp.json()["error"]["message"]
        # The wait left the queue; the load itself goes on for whoever asks next.
        assert router.snapshot.models["slow"].waiting == 0
        assert router.status("slow") is Status.LOADING


async def test_queue_and_eviction_events(fake_router: RouterFactory) -> None:
    async with (
        fake_router({"a": {}, "b": {}}, "--models-max", "1") as router,
        router.client() as http,
    ):
        with router.ctx.scheduler.subscribe() as events:
            await http.post("/completion", json={"model": "a", "prompt": "x"})
            await http.post("/completion", json={"model": "b", "prompt": "x"})
            seen = drain(events)
        queue = [(e["model"], e["data"]) for e in seen if e["event"] == "troupe_queue"]
        assert queue[0] == ("a", {"waiting": 1, "position": 1, "reason": "loading"})
        assert queue[1] == ("a", {"waiting": 0, "position": None, "reason": None})
        assert ("b", {"waiting": 1, "position": 1, "reason": "waiting for a model to stop"}) in (
            queue
        )
        evicts = [(e["model"], e["data"]) for e in seen if e["event"] == "troupe_evict"]
        # In words as before, and typed (``kind``: the metrics' reason label).
        assert evicts == [("a", {"reason": "lru for b", "kind": "lru"})]
        item = {m["id"]: m for m in (await http.get("/models")).json()["data"]}["a"]
        assert item["troupe"]["last_eviction"] == "lru for b"
        assert item["troupe"]["last_load_seconds"] > 0
