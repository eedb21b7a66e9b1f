"""The WebSocket bridge against the fake engine's echoing /v1/realtime."""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

from troupe.sched import Status
from troupe.testing.router import RouterFactory, RunningRouter


async def connect(
    router: RunningRouter, nursery: trio.Nursery, resource: str
) -> trio_websocket.WebSocketConnection:
    port = int(router.url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    nursery.start_soon(_close_later, stream)
    return await trio_websocket.wrap_client_stream(nursery, stream, "127.0.0.1", resource)


async def _close_later(stream: trio.SocketStream) -> None:
    try:
        await trio.sleep_forever()
    finally:
        await stream.aclose()


async def test_text_and_binary_frames_both_ways_and_a_close_code_from_the_child(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router, trio.open_nursery() as nursery:
        ws = await connect(router, nursery, "/v1/realtime?model=a")
        assert router.snapshot.models["a"].in_flight == 1  # the session holds a lease
        await ws.send_message("hello")
        assert await ws.get_message() == "hello"
        await ws.send_message(b"\x00\xffbinary")
        assert await ws.get_message() == b"\x00\xffbinary"
        await ws.send_message(json.dumps({"type": "close", "code": 4001, "reason": "bye"}))
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await ws.get_message()
        assert closed.value.reason.code == 4001
        assert closed.value.reason.reason == "bye"
        with trio.fail_after(5):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)
        nursery.cancel_scope.cancel()


async def test_client_close_code_reaches_the_child_and_frees_the_lease(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router, trio.open_nursery() as nursery:
        ws = await connect(router, nursery, "/v1/realtime?model=a")
        await ws.send_message("ping")
        assert await ws.get_message() == "ping"
        await ws.aclose(4005, "client done")
        with trio.fail_after(5):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)
        nursery.cancel_scope.cancel()


async def test_child_death_closes_the_client(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, trio.open_nursery() as nursery:
        ws = await connect(router, nursery, "/v1/realtime?model=a")
        await ws.send_message("x")
        assert await ws.get_message() == "x"
        await router.ctx.scheduler.unload("a")
        with pytest.raises(trio_websocket.ConnectionClosed):
            with trio.fail_after(15):
                await ws.get_message()
        await router.wait_for_status("a", Status.UNLOADED)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("resource", "status", "message"),
    [
        ("/v1/realtime", 400, "model name is missing from the request"),
        ("/v1/realtime?model=zz", 400, "model 'zz' not found"),
    ],
)
async def test_bad_upgrade_gets_a_json_error(
    fake_router: RouterFactory, resource: str, status: int, message: str
) -> None:
    rejected: list[trio_websocket.ConnectionRejected] = []
    async with fake_router({"a": {}}) as router:
        try:
            async with trio.open_nursery() as nursery:
                await connect(router, nursery, resource)
        except* trio_websocket.ConnectionRejected as group:
            rejected += [
                e for e in group.exceptions if isinstance(e, trio_websocket.ConnectionRejected)
            ]
        assert router.snapshot.running == 0
    assert rejected[0].status_code == status
    assert json.loads(rejected[0].body or b"")["error"]["message"] == message
