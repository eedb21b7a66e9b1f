"""Access records that say what happened: a stream the client cut counts the bytes and
tokens it was sent; Ollama's local routes are recorded; GET /troupe/requests lists
requests in flight, by arrival, without /slots polls among the model traffic; a client
that leaves after the whole answer was written did not "go away"."""

from __future__ import annotations

from typing import cast

import trio

from troupe.http.access import finish
from troupe.http.server.exchange import Exchange
from troupe.ops.access import AccessRecord
from troupe.proxy.client import RelayReport
from troupe_rig.router import RouterFactory

SLOW = {"fake-tps": "20", "fake-tokens": "400"}  # 20 s of tokens: cut long before the end


async def test_a_cut_stream_counts_the_bytes_and_tokens_it_was_sent(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": SLOW}) as router, router.client() as http:
        body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        events = 0
        async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                events += line.startswith("data: ")
                if events == 6:
                    break  # the client closes the stream after a few tokens
        rec = await router.ctx.requests.wait_until(lambda r: r.model == "a")
    assert rec.error == "the client went away"
    assert rec.bytes_out > 0
    assert rec.completion_tokens is not None
    assert 1 <= rec.completion_tokens < 400
    assert rec.stream


async def test_ollama_local_routes_get_a_record(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        for path in ("/api/tags", "/api/ps", "/api/version"):
            assert (await http.get(path)).status_code == 200
            with trio.fail_after(10):
                rec = await router.ctx.requests.wait_until(lambda r, p=path: r.path == p)
            assert (rec.status, rec.kind, rec.method) == (200, "local", "GET")


async def test_recent_requests_in_flight_by_arrival_without_slots_polls(
    fake_router: RouterFactory,
) -> None:
    async with (
        fake_router({"a": {"fake-tps": "20", "fake-tokens": "40"}}) as router,
        router.client() as http,
        trio.open_nursery() as nursery,
    ):
        quick = {"model": "a", "prompt": "x", "n_predict": 1}
        assert (await http.post("/completion", json=quick)).status_code == 200
        assert (await http.get("/slots", params={"model": "a"})).status_code == 200
        long_done = trio.Event()

        async def long_one() -> None:
            body = {"model": "a", "prompt": "long", "n_predict": 40}
            await http.post("/completion", json=body)
            long_done.set()

        nursery.start_soon(long_one)
        with trio.fail_after(10):  # it is listed while it runs
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight > 0)
        ring = (await http.get("/troupe/requests")).json()["data"]
        assert (ring[0]["path"], ring[0]["in_flight"]) == ("/completion", True)
        assert "/slots" not in [item["path"] for item in ring]  # not model traffic
        short = {"model": "a", "prompt": "short", "max_tokens": 1}
        assert (await http.post("/v1/completions", json=short)).status_code == 200
        with trio.fail_after(30):
            await long_done.wait()
        ring = (await http.get("/troupe/requests")).json()["data"]
        local = (await http.get("/troupe/requests", params={"kind": "local"})).json()["data"]
    # Newest arrival first: the short one came after the long one, which ended last.
    assert [item["path"] for item in ring] == ["/v1/completions", "/completion", "/completion"]
    assert not any(item["in_flight"] for item in ring)
    assert "/slots" in [item["path"] for item in local]


class _Answered:
    """An exchange whose whole answer went out (what `finish` reads of it)."""

    started, status, sent = True, 200, 9


async def test_a_client_leaving_after_the_whole_answer_did_not_go_away(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router:
        ex = cast(Exchange, _Answered())
        for whole, expected in ((True, None), (False, "the client went away")):
            rec = AccessRecord(time=0.0, client="-", method="POST", path="/completion", route="")
            report = RelayReport(status=200, bytes_out=9, whole=whole)
            finish(router.ctx, ex, rec, trio.current_time(), report, client_left=True)
            assert (rec.status, rec.error) == (200, expected)
