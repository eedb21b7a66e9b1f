"""/v1/realtime with the openai SDK's realtime client, troupe and the real llama-server.

Each scenario is the SDK's asyncio client in a thread (`run_asyncio`); troupe serves in
the test's Trio run, so its state is checked directly once a scenario returns. Every
event a client receives is validated against the SDK's types (`EventLog`).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from websockets.exceptions import InvalidStatus

from troupe_rig.kv import metric
from troupe_rig.realtime_client import EventLog, run_asyncio, sdk_client
from troupe_rig.router import RouterFactory, RunningRouter

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def user(text: str) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


async def prompt_tokens(http: httpx.AsyncClient, model: str, body: dict[str, Any]) -> int:
    """How many tokens the child's template makes of a chat request (what it evaluates)."""
    prompt = (await http.post("/apply-template", json={"model": model, **body})).json()["prompt"]
    tokens = await http.post(
        "/tokenize",
        json={"model": model, "content": prompt, "add_special": True, "parse_special": True},
    )
    return len(tokens.json()["tokens"])


async def slot_stops_processing(http: httpx.AsyncClient, model: str) -> None:
    # The child tells no one when a slot goes idle: ask it (bounded by the caller).
    while (await http.get("/slots", params={"model": model})).json()[0]["is_processing"]:  # noqa: ASYNC110
        await trio.sleep(0.02)


async def in_flight_zero(router: RunningRouter, model: str) -> None:
    with trio.fail_after(5):
        await router.ctx.scheduler.wait_until(lambda s: s.models[model].in_flight == 0)


def deltas(events: list[Any], kind: str = "response.output_text.delta") -> str:
    return "".join(e.delta for e in events if e.type == kind)


async def test_two_turns_the_second_answer_sees_the_first(real_router: RouterFactory) -> None:
    async def scenario(url: str) -> list[list[Any]]:
        async with sdk_client(url).realtime.connect(model="tiny") as conn:
            log = EventLog(conn)
            assert (await log.next()).type == "session.created"
            update = {"type": "realtime", "instructions": "Answer briefly."}
            await log.send({"type": "session.update", "session": update})
            await log.until("session.updated")
            turns = []
            for text in ("hello", "tell me more"):
                await log.send(user(text))
                await log.until("conversation.item.done")
                await log.send({"type": "response.create", "response": {"max_output_tokens": 8}})
                turns.append(await log.until("response.done"))
            return turns

    async with real_router() as router, router.client() as http:
        first, second = await run_asyncio(scenario, router.url)
        await in_flight_zero(router, "tiny")  # the lease ended with the response
        text = deltas(first)
        kinds = [e.type for e in first]
        head = ["response.created", "response.output_item.added", "conversation.item.added",
                "response.content_part.added"]  # fmt: skip
        tail = ["response.output_text.done", "response.content_part.done",
                "response.output_item.done", "conversation.item.done", "response.done"]  # fmt: skip
        assert kinds[:4] == head
        assert kinds[-5:] == tail
        assert set(kinds[4:-5]) == {"response.output_text.delta"}
        done = first[-1].response
        assert done.status == "incomplete"  # the tiny model never stops by itself
        assert done.status_details.reason == "max_output_tokens"
        assert done.output[0].content[0].text == text == first[-5].text
        assert done.usage.output_tokens == 8
        system = {"role": "system", "content": "Answer briefly."}
        asked = [system, {"role": "user", "content": "hello"}]
        assert done.usage.input_tokens == await prompt_tokens(http, "tiny", {"messages": asked})
        # The second prompt is the whole conversation: the first answer is in it.
        asked += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": "tell me more"},
        ]
        expected = await prompt_tokens(http, "tiny", {"messages": asked})
        assert second[-1].response.usage.input_tokens == expected
        assert second[-1].response.usage.input_tokens > done.usage.total_tokens


async def test_cancel_stops_the_child_generating_at_once(real_router: RouterFactory) -> None:
    async def scenario(url: str) -> list[Any]:
        async with sdk_client(url).realtime.connect(model="gemma") as conn:
            log = EventLog(conn)
            await log.next()
            await log.send(user("Write a long story about a cat."))
            await log.send({"type": "response.create"})  # no limit: until the context is full
            await log.until("response.output_text.delta")
            await log.send({"type": "response.cancel"})
            return await log.until("response.done")

    async with real_router() as router, router.client() as http:
        events = await run_asyncio(scenario, router.url)
        with trio.fail_after(1):
            await slot_stops_processing(http, "gemma")
        await in_flight_zero(router, "gemma")
    done = events[-1].response
    assert done.status == "cancelled"
    assert done.status_details.reason == "client_cancelled"
    assert done.output[0].status == "incomplete"
    kinds = [e.type for e in events]
    assert kinds.index("response.output_item.done") < kinds.index("response.done")


async def test_disconnect_mid_response_frees_the_lease_and_the_slot(
    real_router: RouterFactory,
) -> None:
    async def scenario(url: str) -> None:
        conn = await sdk_client(url).realtime.connect(model="gemma").enter()
        log = EventLog(conn)
        await log.next()
        await log.send(user("Write a long story about a dog."))
        await log.send({"type": "response.create"})
        await log.until("response.output_text.delta")
        conn._connection.transport.abort()  # the client dies: no close frame, a reset

    async with real_router() as router, router.client() as http:
        await run_asyncio(scenario, router.url)
        await in_flight_zero(router, "gemma")
        with trio.fail_after(1):
            await slot_stops_processing(http, "gemma")


async def test_function_call_round_trip(real_router: RouterFactory) -> None:
    """Gemma 3 270M's own template has no tools; ``gemma-tools`` gives it one that
    llama.cpp parses tool calls from. A worked example in the conversation and greedy
    sampling make the small model call the tool."""
    instructions = "You answer every question by calling a function."
    session = {
        "type": "realtime",
        "instructions": instructions,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
    }
    rome = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Rome"}'}  # fmt: skip
    rome_out = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    said = {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "It is sunny in Rome."}]}  # fmt: skip

    async def scenario(url: str) -> tuple[list[Any], list[Any]]:
        async with sdk_client(url).realtime.connect(model="gemma-tools") as conn:
            log = EventLog(conn)
            await log.next()
            await log.send({"type": "session.update", "session": session})
            await log.until("session.updated")
            await log.send(user("What is the weather in Rome?"))
            for item in (rome, rome_out, said):
                await log.send({"type": "conversation.item.create", "item": item})
            await log.send(user("What is the weather in Paris?"))
            await log.send({"type": "response.create", "response": {"max_output_tokens": 40}})
            called = await log.until("response.done")
            for call in called[-1].response.output:
                output = {"type": "function_call_output", "call_id": call.call_id,
                          "output": '{"sky": "cloudy"}'}  # fmt: skip
                await log.send({"type": "conversation.item.create", "item": output})
            answer = {"tool_choice": "none", "max_output_tokens": 5}
            await log.send({"type": "response.create", "response": answer})
            return called, await log.until("response.done")

    async with real_router() as router, router.client() as http:
        called, answered = await run_asyncio(scenario, router.url)
        calls = called[-1].response.output
        assert calls
        assert all(c.type == "function_call" for c in calls)
        call = calls[0]
        assert call.name == "get_weather"
        assert isinstance(json.loads(call.arguments)["city"], str)
        done_args = next(e for e in called if e.type == "response.function_call_arguments.done")
        assert deltas(called, "response.function_call_arguments.delta") == done_args.arguments
        assert done_args.arguments == call.arguments
        # The answer's prompt held the calls and their results, as chat messages.
        tool_calls = [
            {"id": c.call_id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]  # fmt: skip
        messages = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": "What is the weather in Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny in Rome."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": tool_calls},
            *({"role": "tool", "tool_call_id": c.call_id, "content": '{"sky": "cloudy"}'}
              for c in calls),
        ]  # fmt: skip
        expected = await prompt_tokens(http, "gemma-tools", {"messages": messages})
        done = answered[-1].response
        assert done.usage.input_tokens == expected
        assert [item.type for item in done.output] == ["message"]


async def test_unknown_model_is_refused_with_the_upstream_error(real_router: RouterFactory) -> None:
    async def scenario(url: str) -> tuple[int, bytes]:
        try:
            async with sdk_client(url).realtime.connect(model="nope"):
                pass
        except InvalidStatus as exc:
            return exc.response.status_code, exc.response.body or b""
        raise AssertionError("the connection was accepted")

    async with real_router() as router:
        status, body = await run_asyncio(scenario, router.url)
        assert router.snapshot.running == 0
    assert status == 400
    error = json.loads(body)["error"]
    assert error == {
        "code": 400,
        "message": "model 'nope' not found",
        "type": "invalid_request_error",
    }


async def test_malformed_events_get_errors_and_the_session_goes_on(
    real_router: RouterFactory,
) -> None:
    async def scenario(url: str) -> tuple[list[Any], list[Any]]:
        async with sdk_client(url).realtime.connect(model="tiny") as conn:
            log = EventLog(conn)
            await log.next()
            await conn.send_raw("{not json")
            await conn.send_raw(b"\x00\x01 binary")
            await conn.send_raw('{"event_id": "e7", "type": "conversation.item.create"}')
            await conn.send_raw('{"type": "response.dance"}')
            await conn.send_raw('["a", "list"]')
            errors = [await log.next() for _ in range(5)]
            await log.send(user("still there?"))
            await log.send({"type": "response.create", "response": {"max_output_tokens": 3}})
            return errors, await log.until("response.done")

    async with real_router() as router:
        errors, answered = await run_asyncio(scenario, router.url)
    assert [e.type for e in errors] == ["error"] * 5
    codes = [e.error.code for e in errors]
    assert codes == [
        "invalid_json",
        "invalid_event",
        "invalid_value",  # an item.create without an item
        "invalid_value",  # no such event type
        "invalid_event",
    ]
    assert errors[2].error.event_id == "e7"  # the client's event id comes back
    assert answered[-1].response.usage.output_tokens == 3


async def test_a_session_comes_back_to_its_slot_restored(real_router: RouterFactory) -> None:
    # A session is one conversation: when an HTTP chat takes Gemma's one slot between
    # two of its responses, the KV store saves the session's conversation and restores
    # it into the slot for the next response.
    guide = "You are a patient guide to the sea. " * 35  # about 400 tokens: worth saving

    async def scenario(url: str) -> list[list[Any]]:
        async with sdk_client(url) as sdk, sdk.realtime.connect(model="gemma") as conn:
            log = EventLog(conn)
            await log.next()
            update = {"type": "realtime", "instructions": guide}
            await log.send({"type": "session.update", "session": update})
            await log.until("session.updated")
            turns = []
            for text in ("Tell me about the sea.", "And the rivers?"):
                await log.send(user(text))
                await log.until("conversation.item.done")
                await log.send({"type": "response.create", "response": {"max_output_tokens": 6}})
                turns.append(await log.until("response.done"))
                if not turns[1:]:  # another conversation takes the slot meanwhile
                    hills = [{"role": "system", "content": guide.replace("sea", "hills")},
                             {"role": "user", "content": "Tell me about the hills."}]  # fmt: skip
                    await sdk.chat.completions.create(model="gemma", messages=hills, max_tokens=4)
            return turns

    async with real_router() as router:
        first, second = await run_asyncio(scenario, router.url)
        assert deltas(first)
        assert deltas(second)
        # Each conversation saved when the other took the slot; the first one restored.
        counts = [("saves", "saved", 2), ("lookups", "hit", 1), ("restores", "restored", 1)]
        for name, result, times in counts:
            count = await metric(router, f"troupe_kv_{name}_total", model="gemma", result=result)
            assert (name, count) == (name, times)
