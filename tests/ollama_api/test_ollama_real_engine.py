"""Ollama's API through troupe, with the official ``ollama`` client, unchanged, and the
real llama-server. Each answer is checked against Ollama's API reference (docs/api.md):
its fields, its status codes, its streaming (one JSON object per line, the last with
``done``), not only the absence of an exception."""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import ollama
import pytest
import trio

from troupe_rig.hub import Hub
from troupe_rig.kv import metric
from troupe_rig.router import RouterFactory, RunningRouter

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
GREEDY = {"temperature": 0, "seed": 1}


_OPEN: list[ollama.AsyncClient] = []


@pytest.fixture
def real_router(real_router: RouterFactory) -> RouterFactory:
    """The conftest's, closing this module's clients when each router exits (pytest-trio
    runs no autouse async fixture: the clients' sockets would stay open until exit)."""

    @asynccontextmanager
    async def factory(*args: str, **kwargs: Any) -> AsyncIterator[RunningRouter]:
        async with real_router(*args, **kwargs) as router:
            try:
                yield router
            finally:
                with trio.CancelScope(shield=True):
                    while _OPEN:
                        await _OPEN.pop().close()

    return factory


def client(router: RunningRouter, **kwargs: Any) -> ollama.AsyncClient:
    """The official client, pointed at troupe as a user points it at Ollama (closed
    when its router exits)."""
    api = ollama.AsyncClient(host=router.url, timeout=120, **kwargs)
    _OPEN.append(api)
    return api


async def until_unloaded(router: RunningRouter, model: str) -> None:
    with trio.fail_after(30):
        await router.ctx.scheduler.wait_until(lambda s: not s.models[model].status.is_running)


async def test_catalog_version_and_root_as_ollama_lists_them(
    real_router: RouterFactory, gemma_size: int
) -> None:
    async with real_router() as router, router.client() as http:
        api = client(router)
        listed = {m.model: m for m in (await api.list()).models}
        # Every catalog name, in the name:tag form Ollama's clients show and send back.
        assert set(listed) == {"gemma:latest", "gemma-tools:latest", "tiny:latest",
                               "tiny-embed:latest"}  # fmt: skip
        gemma = listed["gemma:latest"]
        assert gemma.size == gemma_size
        assert gemma.digest is not None
        assert len(gemma.digest) == 64
        assert gemma.details is not None
        assert (gemma.details.format, gemma.details.family) == ("gguf", "gemma3")
        assert gemma.details.quantization_level == "Q4_K_M"
        assert gemma.details.parameter_size == "268.1M"
        assert gemma.modified_at is not None

        shown = await api.show("gemma")
        assert shown.capabilities == ["completion"]  # its own template has no tools
        assert shown.template == ""  # the demo GGUF carries none (the engine has its own)
        assert shown.modelinfo is not None
        assert shown.modelinfo["general.architecture"] == "gemma3"
        assert shown.modelinfo["general.parameter_count"] == 268098176
        tools = await api.show("gemma-tools:latest")
        assert tools.capabilities == ["completion", "tools"]
        assert tools.template
        assert "tools" in tools.template
        assert (await api.show("tiny-embed")).capabilities == ["embedding"]
        assert (await api.show("tiny:small")).details == (await api.show("tiny")).details

        version = (await http.get("/api/version")).json()["version"]
        assert [int(p) for p in version.split(".")] >= [0, 12]
        root = await http.get("/")
        assert (root.status_code, root.text) == (200, "Ollama is running")
        head = await http.head("/")
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-length"] == str(len("Ollama is running"))
        assert (await api.ps()).models == []  # nothing loaded by any of that


async def test_chat_whole_streamed_and_through_openai_say_the_same(
    real_router: RouterFactory,
) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    # The translation is compared, each request evaluated like the first: with the KV
    # store's --swa-full the engine reuses a cached Gemma 3 prompt, and the different batch
    # shape can flip a near-tie of the 270M model at temperature 0 (engine numerics).
    async with real_router("--kv-store", "off") as router, router.client() as http:
        api = client(router)
        whole = await api.chat(
            model="gemma", messages=messages, options={**GREEDY, "num_predict": 12}, stream=False
        )
        assert whole.done is True
        assert whole.done_reason == "length"  # num_predict reached
        assert whole.model == "gemma"
        assert whole.message.role == "assistant"
        assert whole.message.content
        assert whole.eval_count == 12
        assert whole.prompt_eval_count is not None
        assert whole.prompt_eval_count > 0
        assert whole.total_duration is not None
        assert whole.eval_duration is not None
        assert whole.load_duration is not None
        assert 0 < whole.eval_duration < whole.total_duration
        assert whole.load_duration < whole.total_duration
        datetime.fromisoformat(str(whole.created_at))

        # The same chat through the OpenAI route: the same text at temperature 0.
        openai = await http.post(
            "/v1/chat/completions",
            json={"model": "gemma", "messages": messages, "max_tokens": 12, **GREEDY},
        )
        assert openai.json()["choices"][0]["message"]["content"] == whole.message.content

        parts = [
            part
            async for part in await api.chat(
                model="gemma:latest",
                messages=messages,
                options={**GREEDY, "num_predict": 12},
                stream=True,
            )
        ]
        assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
        assert all(p.model == "gemma:latest" for p in parts)  # the name asked for
        assert "".join(p.message.content or "" for p in parts) == whole.message.content
        last = parts[-1]
        assert (last.done_reason, last.eval_count, last.message.content) == ("length", 12, "")
        assert last.prompt_eval_count == whole.prompt_eval_count
        # think: the child takes it (a model that does not reason answers the same).
        for think in (True, False):
            thought = await api.chat(
                model="gemma", messages=messages, options={**GREEDY, "num_predict": 12},
                think=think, stream=False,
            )  # fmt: skip
            assert thought.message.content == whole.message.content
            assert not thought.message.thinking
        # Counted like the OpenAI routes' requests: by route and status, and their waits.
        metrics = (await http.get("/metrics")).text
        assert 'troupe_proxied_requests_total{route="/api/chat",status="200"} 4.0' in metrics
        assert 'troupe_queue_wait_seconds_count{model="gemma",outcome="granted"} 5.0' in metrics
        # And each one has its access record, like an OpenAI request: model, tokens.
        ring = (await http.get("/troupe/requests", params={"model": "gemma"})).json()["data"]
        chats = [r for r in ring if r["path"] == "/api/chat"]
        assert len(chats) == 4
        assert {(r["status"], r["kind"], r["completion_tokens"]) for r in chats} == {
            (200, "proxied", 12)
        }
        assert all(r["prompt_tokens"] == whole.prompt_eval_count for r in chats)
        assert sorted(r["stream"] for r in chats) == [False, False, False, True]
        assert all(r["queue_wait"] is not None and r["duration"] > 0 for r in chats)


async def test_a_tool_call_comes_back_as_ollama_sends_it(real_router: RouterFactory) -> None:
    """``gemma-tools``' template has tool calls; a worked example and greedy sampling make
    the small model call the tool. Arguments are an object (Ollama's), not a string."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You answer every question by calling a function."},
        {"role": "user", "content": "What is the weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        {"role": "assistant", "content": "It is sunny in Rome."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]  # fmt: skip
    async with real_router() as router:
        api = client(router)
        answer = await api.chat(
            model="gemma-tools",
            messages=messages,
            tools=[WEATHER],
            options={**GREEDY, "num_predict": 40},
            stream=False,
        )
        calls = answer.message.tool_calls
        assert calls, answer.message
        assert calls[0].function.name == "get_weather"
        assert isinstance(calls[0].function.arguments["city"], str)
        assert answer.done is True
        # Streamed, the call comes whole in one piece before the last.
        parts = [
            p
            async for p in await api.chat(
                model="gemma-tools",
                messages=messages,
                tools=[WEATHER],
                options={**GREEDY, "num_predict": 40},
                stream=True,
            )
        ]
        streamed = [c for p in parts for c in (p.message.tool_calls or [])]
        assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [
            (c.function.name, dict(c.function.arguments)) for c in calls
        ]


async def test_structured_output_follows_the_schema(real_router: RouterFactory) -> None:
    schema = {
        "type": "object",
        "properties": {"age": {"type": "integer"}, "available": {"type": "boolean"}},
        "required": ["age", "available"],
    }
    prompt = "Ollama is 22 years old and busy saving the world. Answer in JSON."
    async with real_router() as router:
        api = client(router)
        answer = await api.chat(
            model="gemma",
            messages=[{"role": "user", "content": prompt}],
            format=schema,
            options={**GREEDY, "num_predict": 40},
            stream=False,
        )
        value = json.loads(answer.message.content or "")
        assert set(value) == {"age", "available"}
        assert isinstance(value["age"], int)
        assert isinstance(value["available"], bool)
        # On /api/generate too; "json" (any object) constrains the first token already
        # (the small model then pads with whitespace, as Ollama's docs warn it may).
        schema_answer = await api.generate(
            model="gemma", prompt=prompt, format=schema, options={**GREEDY, "num_predict": 40}
        )
        assert set(json.loads(schema_answer.response)) == {"age", "available"}
        plain = await api.generate(
            model="gemma", prompt=prompt, format="json", options={**GREEDY, "num_predict": 8}
        )
        assert plain.response.startswith("{")
        free = await api.generate(
            model="gemma", prompt=prompt, options={**GREEDY, "num_predict": 8}
        )
        assert not free.response.startswith("{")  # what "json" changed


async def test_generate_templated_raw_and_streamed(
    real_router: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with real_router() as router, router.client() as http:
        api = client(router)
        options = {**GREEDY, "num_predict": 8}
        raw = await api.generate(
            model="gemma", prompt="The capital of France is", raw=True, options=options
        )
        assert raw.done is True
        assert raw.done_reason == "length"
        assert raw.eval_count == 8
        native = await http.post(
            "/completion",
            json={"model": "gemma", "prompt": "The capital of France is", "n_predict": 8,
                  **GREEDY},
        )  # fmt: skip
        assert raw.response == native.json()["content"]  # the same text as llama.cpp's own
        # options reach the child under llama.cpp's names: a stop string ends the answer.
        word = raw.response.split()[1]
        stopped = await api.generate(
            model="gemma", prompt="The capital of France is", raw=True,
            options={**options, "stop": [word]},
        )  # fmt: skip
        assert stopped.done_reason == "stop"
        assert word not in stopped.response
        assert raw.response.startswith(stopped.response)
        parts = [
            p
            async for p in await api.generate(
                model="gemma",
                prompt="The capital of France is",
                raw=True,
                options=options,
                stream=True,
            )
        ]
        assert "".join(p.response for p in parts) == raw.response
        assert parts[-1].done
        assert parts[-1].response == ""
        templated = await api.generate(
            model="gemma", prompt="Say hello.", system="You are terse.", options=options
        )
        # Templated as a chat: the same as the chat with those two messages.
        chat = await api.chat(
            model="gemma",
            messages=[{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": "Say hello."}],
            options=options,
        )  # fmt: skip
        assert templated.response == chat.message.content
        # A load-time option cannot change the running child: a warning line says so.
        sized = await api.generate(
            model="gemma", prompt="Say hello.", system="You are terse.",
            options={**options, "num_ctx": 8192},
        )  # fmt: skip
        assert sized.response == templated.response
        warned = [r.getMessage() for r in caplog.records if r.name == "troupe.ollama"]
        assert any("options num_ctx ignored" in w for w in warned), warned
        caplog.clear()
        await api.generate(  # the context it was started with: nothing to warn about
            model="gemma", prompt="Say hello.", options={**options, "num_ctx": 2048}
        )
        assert not [r for r in caplog.records if r.name == "troupe.ollama"]


async def test_embed_and_the_older_embeddings(real_router: RouterFactory) -> None:
    async with real_router() as router, router.client() as http:
        api = client(router)
        out = await api.embed(model="tiny-embed", input=["why is the sky blue?", "grass"])
        assert len(out.embeddings) == 2
        width = len(out.embeddings[0])
        assert width > 0
        assert len(out.embeddings[1]) == width
        assert out.embeddings[0] != out.embeddings[1]
        assert math.isclose(math.hypot(*out.embeddings[0]), 1.0, rel_tol=1e-3)  # normalised
        assert out.prompt_eval_count is not None
        assert out.prompt_eval_count > 0
        one = await api.embed(model="tiny-embed", input="grass")
        assert one.embeddings == [out.embeddings[1]]
        older = await api.embeddings(model="tiny-embed", prompt="grass")
        assert list(older.embedding) == list(out.embeddings[1])
        openai = await http.post("/v1/embeddings", json={"model": "tiny-embed", "input": "grass"})
        assert openai.json()["data"][0]["embedding"] == list(out.embeddings[1])  # the same
        # Each has its access record with the tokens the child counted.
        ring = (await http.get("/troupe/requests", params={"model": "tiny-embed"})).json()["data"]
        counted = {(r["path"], r["prompt_tokens"]) for r in ring if r["path"] != "/v1/embeddings"}
        grass = openai.json()["usage"]["prompt_tokens"]
        assert one.prompt_eval_count == grass
        assert counted == {("/api/embed", out.prompt_eval_count), ("/api/embed", grass),
                           ("/api/embeddings", grass)}  # fmt: skip


async def test_keep_alive_unloads_pins_and_sets_the_idle_timeout(
    real_router: RouterFactory,
) -> None:
    async with real_router() as router:
        api = client(router)
        scheduler = router.ctx.scheduler
        options = {"num_predict": 2}
        # An empty prompt loads the model (Ollama's "load"), an empty one with 0 unloads it.
        loaded = await api.generate(model="tiny", prompt="")
        assert (loaded.done, loaded.done_reason, loaded.response) == (True, "load", "")
        assert [m.model for m in (await api.ps()).models] == ["tiny:latest"]
        gone = await api.generate(model="tiny", prompt="", keep_alive=0)
        assert gone.done_reason == "unload"
        assert (await api.ps()).models == []

        # 0: unloaded as soon as the answer is done.
        await api.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                       options=options, keep_alive=0)  # fmt: skip
        await until_unloaded(router, "tiny")

        # -1: kept loaded (pinned), until a later keep_alive says otherwise.
        await api.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                       options=options, keep_alive=-1)  # fmt: skip
        view = scheduler.snapshot.models["tiny"]
        assert (view.pin, view.ttl, view.status.is_running) == (True, None, True)
        (ps,) = (await api.ps()).models
        assert ps.expires_at is not None
        assert ps.expires_at.year > 2300

        # A duration: the idle timeout, shown as the time it expires.
        await api.generate(model="tiny", prompt="hi", options=options, keep_alive="10m")
        view = scheduler.snapshot.models["tiny"]
        assert (view.pin, view.ttl) == (False, 600.0)
        (ps,) = (await api.ps()).models
        assert ps.expires_at is not None
        left = ps.expires_at - datetime.now(UTC)
        assert timedelta(minutes=9) < left <= timedelta(minutes=10)

        with pytest.raises(ollama.ResponseError) as bad:
            await api.generate(model="tiny", prompt="hi", keep_alive="soon")
        assert bad.value.status_code == 400
        assert "invalid duration" in bad.value.error


async def test_unknown_models_and_unsupported_routes_get_ollamas_errors(
    real_router: RouterFactory,
) -> None:
    async with real_router() as router:
        api = client(router)
        for call in (
            api.chat(model="nope", messages=[{"role": "user", "content": "x"}]),
            api.generate(model="nope:7b", prompt="x"),
            api.show("nope"),
            api.embed(model="nope", input="x"),
            api.delete("nope"),
        ):
            with pytest.raises(ollama.ResponseError) as err:
                await call
            assert err.value.status_code == 404
            assert "not found" in err.value.error
        for call in (
            api.copy("gemma", "gemma-copy"),
            api.create(model="mario", from_="gemma", system="You are Mario."),
            api.push("gemma"),
        ):
            with pytest.raises(ollama.ResponseError) as err:
                await call
            assert err.value.status_code == 501
            assert err.value.error.startswith("troupe cannot")
        with pytest.raises(ollama.ResponseError) as err:
            await api.delete("gemma")  # a preset's model: the operator's files
        assert err.value.status_code == 400
        assert router.snapshot.running == 0


async def test_the_api_key_guards_the_ollama_routes(real_router: RouterFactory) -> None:
    async with real_router("--api-key", "sekret") as router:
        with pytest.raises(ollama.ResponseError) as err:
            await client(router).list()
        assert err.value.status_code == 401
        assert err.value.error == "Invalid API Key"  # Ollama's shape: the client shows it
        keyed = client(router, headers={"Authorization": "Bearer sekret"})
        answer = await keyed.generate(model="tiny", prompt="hi", options={"num_predict": 2})
        assert answer.done
        assert answer.eval_count == 2


async def test_a_client_that_goes_away_stops_the_generation(real_router: RouterFactory) -> None:
    async with real_router() as router, router.client() as http:
        body = {"model": "gemma", "messages": [{"role": "user", "content": "A long story."}],
                "options": {"num_predict": 2000}}  # fmt: skip
        host, port = router.url.removeprefix("http://").split(":")
        payload = json.dumps(body).encode()
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:  # a plain socket: read the first piece, then go away
            await stream.send_all(
                b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload)
            )
            got = b""
            while b'"done":false' not in got:
                got += await stream.receive_some(4096)
            assert b"Content-Type: application/x-ndjson" in got
        with trio.fail_after(10):
            await router.ctx.scheduler.wait_until(lambda s: s.models["gemma"].in_flight == 0)
            # The child tells no one when a slot goes idle: ask it.
            while (await http.get("/slots", params={"model": "gemma"})).json()[0][  # noqa: ASYNC110
                "is_processing"
            ]:
                await trio.sleep(0.02)


def hub_env(hub: Hub, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    return {**env, "LLAMA_CACHE": str(cache), "MODEL_ENDPOINT": hub.url}


async def test_pull_streams_progress_then_the_model_serves_and_deletes(
    real_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    file = tiny_files["m-Q4_K_M.gguf"]
    size = file.stat().st_size
    hub.add_repo("org/tiny", {"m-Q4_K_M.gguf": file, "m-Q8_0.gguf": tiny_files["m-Q8_0.gguf"]})
    async with real_router(environ=hub_env(hub, tmp_path / "cache")) as router:
        api = client(router)
        parts = [p async for p in await api.pull("org/tiny:Q4_K_M", stream=True)]
        statuses = [p.status for p in parts]
        assert statuses[0] == "pulling manifest"
        assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
        progress = [p for p in parts if p.digest is not None]
        assert progress
        assert all(p.status == f"pulling {p.digest}" for p in progress)
        assert {p.digest for p in progress} == {"m-Q4_K_M.gguf"}
        done = [p.completed for p in progress]
        assert done == sorted(done)
        assert done[-1] == size
        assert all(p.total == size for p in progress)

        names = [m.model for m in (await api.list()).models]
        assert "org/tiny:Q4_K_M" in names
        answer = await api.generate(model="org/tiny", prompt="hi", options={"num_predict": 2})
        assert answer.eval_count == 2  # org/repo means the repository's one model
        again = await api.pull("org/tiny:Q4_K_M")  # there already
        assert again.status == "success"

        # Ollama's own name for a Hugging Face model: hf.co/org/repo:TAG.
        other = await api.pull("hf.co/org/tiny:Q8_0")
        assert other.status == "success"
        assert "org/tiny:Q8_0" in [m.model for m in (await api.list()).models]
        shown = await api.show("hf.co/org/tiny:Q8_0")
        assert shown.modelfile is not None
        assert shown.modelfile.startswith("# troupe serves org/tiny:Q8_0 ")

        deleted = await api.delete("org/tiny:Q4_K_M")
        assert deleted.status == "success"
        assert "org/tiny:Q4_K_M" not in [m.model for m in (await api.list()).models]

        with pytest.raises(ollama.ResponseError) as err:
            await api.pull("org/missing:Q4_K_M")
        assert err.value.status_code == 404


async def test_a_conversation_returns_to_its_slot_restored_over_one_slot(
    real_router: RouterFactory,
) -> None:
    # Gemma's child has one slot; two conversations of about 400 tokens take turns on it.
    # The second takes the slot: the first is saved to the KV store, and restored into
    # the slot when it comes back, as an OpenAI request's would be.
    def history(topic: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": f"You are a patient guide to the {topic}. " * 35},
            {"role": "user", "content": f"Tell me about the {topic}."},
        ]

    options = {**GREEDY, "num_predict": 6}
    sea = history("sea")
    async with real_router() as router:
        api = client(router)
        first = await api.chat(model="gemma", messages=sea, options=options, stream=False)
        await api.chat(model="gemma", messages=history("hills"), options=options, stream=False)
        sea += [{"role": "assistant", "content": first.message.content or ""}]
        sea.append({"role": "user", "content": "And the rivers?"})
        parts = [p async for p in await api.chat(model="gemma", messages=sea, options=options,
                                                  stream=True)]  # fmt: skip
        back = "".join(p.message.content or "" for p in parts)
        assert parts[-1].done is True
        # Each conversation saved when the other took the slot; the first one restored.
        counts = [("saves", "saved", 2), ("lookups", "hit", 1), ("restores", "restored", 1)]
        for name, result, times in counts:
            count = await metric(router, f"troupe_kv_{name}_total", model="gemma", result=result)
            assert (name, count) == (name, times)
    # At temperature 0 a fresh child with no store answers the same.
    async with real_router("--kv-store", "off") as router:
        fresh = await client(router).chat(model="gemma", messages=sea, options=options)
        assert fresh.message.content == back
