"""/v1/realtime's handshake, session and conversation rules, over real sockets.

The fake engine stands in for the child here only where no generation is needed or
its timing matters; what a user sees from the real engine is in
test_realtime_real_engine.py.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
import trio
import trio_websocket

from troupe.realtime import handshake
from troupe.realtime.session import Limits
from troupe_rig.realtime_client import EventLog, raw_socket, run_asyncio, sdk_client, validate
from troupe_rig.router import RouterFactory, RunningRouter


async def rejected(router: RunningRouter, resource: str, **kwargs: Any) -> tuple[int, Any]:
    errors: list[trio_websocket.ConnectionRejected] = []
    try:
        async with raw_socket(router.url, resource, **kwargs):
            pass
    except* trio_websocket.ConnectionRejected as group:
        errors += group.exceptions  # type: ignore[arg-type]
    assert errors, f"{resource} was accepted"
    return errors[0].status_code, json.loads(errors[0].body or b"")


async def next_event(ws: trio_websocket.WebSocketConnection) -> Any:
    with trio.fail_after(10):
        return validate(await ws.get_message())


def user(text: str) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


async def test_refusals_are_http_answers_with_upstream_bodies(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"alias": "al"}}, "--api-key", "k1") as router:
        auth = [(b"authorization", b"Bearer k1")]
        status, body = await rejected(router, "/v1/realtime?model=a")
        assert (status, body["error"]["message"]) == (401, "Invalid API Key")
        status, body = await rejected(
            router, "/v1/realtime?model=a", headers=[(b"x-api-key", b"no")]
        )
        assert status == 401
        status, body = await rejected(router, "/v1/nothing?model=a", headers=auth)
        assert (status, body["error"]["message"]) == (404, "File Not Found")
        status, body = await rejected(router, "/v1/realtime", headers=auth)
        assert (status, body["error"]["message"]) == (400, "model name is missing from the request")
        status, body = await rejected(router, "/v1/realtime?model=zz", headers=auth)
        assert (status, body["error"]["message"]) == (400, "model 'zz' not found")
        status, body = await rejected(router, "/v1/realtime?model=a&autoload=0", headers=auth)
        assert (status, body["error"]["message"]) == (400, "model is not loaded")
        assert router.snapshot.running == 0


async def test_keys_by_header_or_browser_subprotocol_and_the_realtime_subprotocol(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"alias": "al"}}, "--api-key", "k1") as router:
        protocols = ["realtime", "openai-insecure-api-key.k1"]
        async with raw_socket(router.url, "/realtime?model=al", subprotocols=protocols) as ws:
            assert ws.subprotocol == "realtime"
            created = await next_event(ws)
            assert created.type == "session.created"
            assert created.session.model == "a"  # the alias resolved
        async with raw_socket(
            router.url, "/v1/realtime?model=a", headers=[(b"x-api-key", b"k1")]
        ) as ws:
            assert ws.subprotocol is None  # none proposed, none chosen
            assert (await next_event(ws)).type == "session.created"

        async def scenario(url: str) -> str:
            async with sdk_client(url, api_key="k1").realtime.connect(model="a") as conn:
                return str((await EventLog(conn).next()).type)

        assert await run_asyncio(scenario, router.url) == "session.created"


async def test_api_prefix(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--api-prefix", "/llm") as router:
        async with raw_socket(router.url, "/llm/v1/realtime?model=a") as ws:
            assert (await next_event(ws)).type == "session.created"
        status, _ = await rejected(router, "/v1/realtime?model=a")
        assert status == 404


async def test_an_idle_session_holds_no_lease(fake_router: RouterFactory) -> None:
    """The model is leased per response: connecting loads nothing, and between two
    responses nothing is in flight (an idle session never pins a model)."""
    async with (
        fake_router({"a": {}}) as router,
        raw_socket(router.url, "/v1/realtime?model=a") as ws,
    ):
        await next_event(ws)
        await ws.send_message(json.dumps(user("hi")))
        await next_event(ws)
        await next_event(ws)
        assert router.snapshot.running == 0
        await ws.send_message(json.dumps({"type": "response.create"}))
        kinds = []
        while not kinds or kinds[-1] != "response.done":
            kinds.append((await next_event(ws)).type)
        await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)
        assert router.snapshot.models["a"].status.is_running


async def test_session_update_names_each_bad_field_and_keeps_the_rest(
    fake_router: RouterFactory,
) -> None:
    session = {
        "type": "realtime",
        "instructions": "Be brief.",
        "temperature": 7,
        "output_modalities": ["audio"],
        "tools": [{"type": "mcp", "server_label": "x"}],
        "max_output_tokens": 20,
        "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
        "colour": "blue",
    }
    async with (
        fake_router({"a": {}}) as router,
        raw_socket(router.url, "/v1/realtime?model=a") as ws,
    ):
        await next_event(ws)
        await ws.send_message(json.dumps({"type": "session.update", "session": session}))
        error, updated = await next_event(ws), await next_event(ws)
    assert error.type == "error"
    for name in ("session.temperature", "session.output_modalities", "session.tools[0].type",
                 "session.audio.input.turn_detection", "session.colour"):  # fmt: skip
        assert name in error.error.message
    assert updated.type == "session.updated"
    assert updated.session.instructions == "Be brief."
    assert updated.session.max_output_tokens == 20
    assert updated.session.output_modalities == ["text"]


async def test_conversation_items_create_retrieve_delete_and_errors(
    fake_router: RouterFactory,
) -> None:
    async with (
        fake_router({"a": {}}) as router,
        raw_socket(router.url, "/v1/realtime?model=a") as ws,
    ):

        async def send(event: dict[str, Any]) -> Any:
            await ws.send_message(json.dumps(event))
            return await next_event(ws)

        await next_event(ws)
        added = await send({**user("one"), "event_id": "c1"})
        assert added.type == "conversation.item.added"
        first = added.item.id
        assert (await next_event(ws)).type == "conversation.item.done"
        item = {"id": "mine", "type": "message", "role": "system",
                "content": [{"type": "input_text", "text": "zero"}]}  # fmt: skip
        added = await send(
            {"type": "conversation.item.create", "previous_item_id": "root", "item": item}
        )
        assert (added.item.id, added.previous_item_id) == ("mine", None)
        await next_event(ws)
        again = await send({"type": "conversation.item.create", "item": item})
        assert again.error.code == "item_id_exists"
        retrieved = await send({"type": "conversation.item.retrieve", "item_id": first})
        assert retrieved.item.content[0].text == "one"
        truncate = {"type": "conversation.item.truncate", "item_id": first, "content_index": 0,
                    "audio_end_ms": 0}  # fmt: skip
        assert (await send(truncate)).error.param == "item_id"  # a user message
        audio = {**user("x"), "item": {**user("x")["item"], "content": [
            {"type": "input_audio", "audio": "AAAA"}]}}  # fmt: skip
        error = await send(audio)
        assert error.error.code == "unsupported_modality"  # a text model
        error = await send({"type": "input_audio_buffer.append", "audio": "AAAA"})
        assert error.error.code == "unsupported_modality"
        deleted = await send({"type": "conversation.item.delete", "item_id": first})
        assert deleted.type == "conversation.item.deleted"
        missing = await send({"type": "conversation.item.retrieve", "item_id": first})
        assert (missing.error.code, missing.error.param) == ("item_not_found", "item_id")
        bad = await send(
            {"type": "conversation.item.create", "previous_item_id": "nope", **user("x")}
        )
        assert bad.error.code == "item_not_found"
        cancel = await send({"type": "response.cancel"})
        assert cancel.error.code == "response_cancel_not_active"


async def test_one_response_at_a_time_and_out_of_band_responses(
    fake_router: RouterFactory,
) -> None:
    async with (
        fake_router({"a": {"fake-tps": "200", "fake-tokens": "40"}}) as router,
        raw_socket(router.url, "/v1/realtime?model=a") as ws,
    ):
        await next_event(ws)
        await ws.send_message(json.dumps(user("hi")))
        await next_event(ws)
        await next_event(ws)
        oob = {"conversation": "none", "metadata": {"topic": "side"}, "input": [
            {"type": "item_reference", "id": "nope"}]}  # fmt: skip
        await ws.send_message(json.dumps({"type": "response.create", "response": oob}))
        assert (await next_event(ws)).error.code == "item_not_found"
        await ws.send_message(
            json.dumps({"type": "response.create", "response": {**oob, "input": []}})
        )
        created = await next_event(ws)
        assert created.type == "response.created"
        assert created.response.conversation_id is None
        await ws.send_message(json.dumps({"type": "response.create"}))
        events = []
        while not events or events[-1].type != "response.done":
            events.append(await next_event(ws))
        busy = [e for e in events if e.type == "error"]
        assert busy[0].error.code == "conversation_already_has_active_response"
        assert created.response.id in busy[0].error.message
        assert not [e for e in events if e.type.startswith("conversation.")]  # out of band
        assert events[-1].response.metadata == {"topic": "side"}
        await ws.send_message(json.dumps({"type": "conversation.item.retrieve", "item_id": "x"}))
        await next_event(ws)  # the session still answers


async def test_a_full_conversation_is_refused_with_an_error(
    fake_router: RouterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 5
    monkeypatch.setattr(handshake, "LIMITS", Limits(max_items=limit))
    async with (
        fake_router({"a": {}}) as router,
        raw_socket(router.url, "/v1/realtime?model=a") as ws,
    ):
        await next_event(ws)
        for i in range(limit):
            await ws.send_message(json.dumps(user(str(i))))
        got = 0
        while got < 2 * limit:
            assert (await next_event(ws)).type.startswith("conversation.item.")
            got += 1
        await ws.send_message(json.dumps(user("one too many")))
        error = await next_event(ws)
        assert error.error.code == "conversation_too_long"


async def test_a_message_over_the_limit_closes_with_1009(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--ws-max-message-mib", "1") as router:
        async with raw_socket(router.url, "/v1/realtime?model=a", max_message_size=4 << 20) as ws:
            await next_event(ws)
            # Just over the limit: the server stops reading there, and the rest of the
            # frame still fits the socket buffers (a bigger one could block the sender).
            big = json.dumps(user("x" * ((1 << 20) + 10_000)))
            async with trio.open_nursery() as nursery:
                # The server stops reading at the limit: send in the background.
                nursery.start_soon(_send_quietly, ws, big)
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    with trio.fail_after(10):
                        await ws.get_message()
                nursery.cancel_scope.cancel()
        assert closed.value.reason.code == 1009


async def _send_quietly(ws: trio_websocket.WebSocketConnection, message: str) -> None:
    with contextlib.suppress(trio_websocket.ConnectionClosed):
        await ws.send_message(message)


async def test_shutdown_closes_sessions_with_1001(fake_router: RouterFactory) -> None:
    async with (
        fake_router({"a": {}}) as router,
        raw_socket(router.url, "/v1/realtime?model=a") as ws,
    ):
        await next_event(ws)
        router.ctx.http_stop.set()
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            with trio.fail_after(5):
                await ws.get_message()
        assert closed.value.reason.code == 1001
