"""Access records the real engine cannot stage on demand: a client that
leaves while its model loads, an unknown model, a conversation id; and the ring's route."""

from __future__ import annotations

from functools import partial

import trio

from troupe.http.access import CLIENT_CLOSED
from troupe.sched import Status
from troupe_rig.router import RouterFactory


async def test_client_gone_while_waiting_unknown_model_and_conversation(
    fake_router: RouterFactory,
) -> None:
    async with (
        fake_router({"slow": {"fake-load-time": "30"}, "quick": {}}) as router,
        router.client() as http,
    ):
        requests = router.ctx.requests
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(http.post, "/completion", json={"model": "slow"}))
            await router.wait_for_status("slow", Status.LOADING)
            nursery.cancel_scope.cancel()  # the client gives up while the model loads
        left = await requests.wait_until(lambda r: r.model == "slow")
        assert left.status == CLIENT_CLOSED
        assert left.error == "the client went away"
        assert left.queue_wait is not None

        resp = await http.post("/completion", json={"model": "nope", "prompt": "x"})
        assert resp.status_code == 400
        unknown = await requests.wait_until(lambda r: r.model == "nope")
        assert (unknown.status, unknown.catalogd) == (400, False)
        assert unknown.error == "model 'nope' not found"

        headers = {"X-Conversation-Id": "conv-7"}
        body = {"model": "quick", "prompt": "x", "n_predict": 2}
        assert (await http.post("/completion", json=body, headers=headers)).status_code == 200
        conv = await requests.wait_until(lambda r: r.model == "quick")
        assert conv.conversation == "conv-7"

        ring = (await http.get("/troupe/requests", params={"model": "nope"})).json()["data"]
        assert [item["status"] for item in ring] == [400]
        bad = await http.get("/troupe/requests", params={"limit": "many"})
        assert bad.status_code == 400
        metrics = (await http.get("/metrics")).text
    # An unknown name is not a label of its own (bounded cardinality).
    assert 'model="nope"' not in metrics
    assert (
        'troupe_request_duration_seconds_count{model="-",route="/completion",status="400"}'
        in metrics
    )
