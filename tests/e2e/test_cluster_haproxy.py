"""Three ``troupe serve`` nodes on loopback behind real HAProxy, configured by ``troupe
cluster render``; the real engine with tiny models; the official ``openai`` SDK
unchanged through the balancer.

n1 and n2 list tiny-a, tiny-b and tiny-c; n3 lists only tiny-a and tiny-b, so tiny-c
may only go to n1 or n2. Which node is a model's home is troupe's placement
(`troupe.cluster.rank`); the balancer says which node it sent a request to
(``X-Troupe-Node``), and each node's own ``/models`` says what it has loaded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import trio

from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.cluster import ClusterStack, open_cluster
from troupe_rig.realtime_client import EventLog, run_asyncio, sdk_client

LONG = 200_000  # bytes of message before the SDK writes "model": past HAProxy's 16 KB
CTX = 32768


@pytest.fixture
def catalogues(tmp_path: Path) -> list[Path]:
    # A long context (32 MiB of KV each), so a long generation is still going when its
    # node is killed (the tiny models make ~4,000 tokens a second).
    full, partial = tmp_path / "full", tmp_path / "partial"
    names = ("tiny-a", "tiny-b", "tiny-c")
    write_tiny_models(full, [TinyModel(n, seed=i, n_ctx=CTX) for i, n in enumerate(names)])
    partial.mkdir()
    for name in ("tiny-a", "tiny-b"):
        (partial / f"{name}.gguf").symlink_to(full / f"{name}.gguf")
    return [full, full, partial]


@asynccontextmanager
async def cluster(
    tmp_path: Path, catalogues: list[Path], haproxy_path: Path, maxconn: int = 8
) -> AsyncIterator[ClusterStack]:
    args = ["--models-max", "2", "--ctx-size", str(CTX)]
    async with open_cluster(
        tmp_path / "cluster", catalogues, args, haproxy=haproxy_path, maxconn=maxconn
    ) as stack:
        yield stack


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def _chat(url: str, model: str, content: str = "hi", **extra: Any) -> tuple[str, str]:
    """(the node HAProxy sent it to, the answer's text)."""
    with _client(url) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=4, **extra
        )
        answer = raw.parse()
    return raw.headers.get("x-troupe-node", ""), answer.choices[0].message.content or ""


def _long_chat(url: str, model: str, **extra: Any) -> tuple[str, str]:
    """A 200 KB chat: the tiny model's context cannot take it, so the answer is the
    model's child's own 400 (which proves the request reached it)."""
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(url, model, "x" * LONG, **extra)
    return caught.value.response.headers.get("x-troupe-node", ""), caught.value.message


def _stream(url: str, model: str) -> str:
    with _client(url) as client:
        stream = client.completions.create(model=model, prompt="hello", max_tokens=16, stream=True)
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


async def test_each_model_on_its_node_long_bodies_streams_realtime_and_the_union(
    tmp_path: Path, catalogues: list[Path], haproxy_path: Path
) -> None:
    async with cluster(tmp_path, catalogues, haproxy_path) as stack:
        assert [n.name for n in stack.order("tiny-c")] != []
        assert "n3" not in [n.name for n in stack.order("tiny-c")]  # not in its catalogue

        # Realtime first: the WebSocket reaches tiny-c's home by ?model= alone.
        async def realtime(url: str) -> list[str]:
            async with sdk_client(url).realtime.connect(model="tiny-c") as conn:
                log = EventLog(conn)
                assert (await log.next()).type == "session.created"
                item = {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hello through haproxy"}],
                }
                await log.send({"type": "conversation.item.create", "item": item})
                await log.send({"type": "response.create", "response": {"max_output_tokens": 4}})
                return [e.type for e in await log.until("response.done")]

        kinds = await run_asyncio(realtime, stack.url)
        assert kinds[-1] == "response.done"
        assert "response.output_text.delta" in kinds
        assert await stack.loaded_on("tiny-c") == [stack.order("tiny-c")[0].name]

        # A short chat goes to its model's home, every time.
        for model in ("tiny-a", "tiny-b", "tiny-c"):
            home = stack.order(model)[0].name
            for _ in range(2):
                node, text = await trio.to_thread.run_sync(_chat, stack.url, model)
                assert node == home
                assert text
            assert await stack.loaded_on(model) == [home]

        # 200 KB before "model": HAProxy cannot read it and sends the request to any node,
        # which forwards it to the home node: the child there answers, no other loads it.
        landed = set()
        for _ in range(4):
            node, message = await trio.to_thread.run_sync(_long_chat, stack.url, "tiny-b")
            assert "context" in message
            landed.add(node)
        assert await stack.loaded_on("tiny-b") == [stack.order("tiny-b")[0].name]

        # Straight to a node that is not tiny-a's home: forwarded there.
        home, other = stack.order("tiny-a")[0], stack.order("tiny-a")[1]
        _, message = await trio.to_thread.run_sync(_long_chat, other.url, "tiny-a")
        assert "context" in message
        assert await stack.loaded_on("tiny-a") == [home.name]
        _, text = await trio.to_thread.run_sync(_chat, other.url, "tiny-a")
        assert text
        assert await stack.loaded_on("tiny-a") == [home.name]

        # Streaming through the balancer, relayed as it comes.
        text = await trio.to_thread.run_sync(_stream, stack.url, "tiny-b")
        assert text

        # A resumable stream (X-Conversation-Id) runs on its model's home; another node
        # finds it there: replay, lookup and delete.
        holder, elsewhere = stack.order("tiny-b")[0], stack.order("tiny-b")[-1]
        body = {"model": "tiny-b", "prompt": "hi", "max_tokens": 6, "stream": True}
        async with httpx.AsyncClient(timeout=30) as http:
            first = await http.post(
                stack.url + "/v1/completions", json=body, headers={"x-conversation-id": "c-1"}
            )
            assert first.headers["x-troupe-node"] == holder.name
            replay = await http.get(elsewhere.url + "/v1/stream", params={"conv_id": "c-1"})
            assert replay.status_code == 200
            assert replay.text == first.text  # the same events, from the holder's child
            found = await http.post(
                elsewhere.url + "/v1/streams/lookup", json={"conversation_ids": ["c-1"]}
            )
            assert [item["conversation_id"] for item in found.json()] == ["c-1"]
            gone = await http.delete(elsewhere.url + "/v1/stream", params={"conv_id": "c-1"})
            assert gone.status_code == 204
            found = await http.post(
                holder.url + "/v1/streams/lookup", json={"conversation_ids": ["c-1"]}
            )
            assert found.json() == []
            missing = await http.get(elsewhere.url + "/v1/stream", params={"conv_id": "c-1"})
            assert missing.status_code == 404

        # GET /v1/models through the balancer: every node's models, once each, where
        # each is loaded.
        async with httpx.AsyncClient(timeout=30) as http:
            listed = (await http.get(stack.url + "/v1/models")).json()
        by_id = {m["id"]: m for m in listed["data"]}
        assert sorted(by_id) == ["tiny-a", "tiny-b", "tiny-c"]
        assert listed["troupe"]["unreachable"] == []
        for model, item in by_id.items():
            assert item["status"]["value"] == "loaded"
            where = item["troupe"]["nodes"]
            assert len(where) == len(stack.models[model])
            loaded = [u for u, status in where.items() if status == "loaded"]
            assert loaded in ([stack.order(model)[0].url], ["self"])

        # A request already forwarded once is served where it lands, never forwarded
        # again: this one loads tiny-a beside its home.
        _, text = await trio.to_thread.run_sync(
            lambda: _chat(other.url, "tiny-a", extra_headers={"x-troupe-forwarded": "n0"})
        )
        assert text
        assert sorted(await stack.loaded_on("tiny-a")) == sorted([home.name, other.name])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stream_until_cut(url: str, model: str, first: trio.Event) -> BaseException | None:
    """A long stream: ``first`` set once a token arrived; what ended it (None: it ended
    normally, which it must not here)."""
    with _client(url) as client:
        stream = client.completions.create(
            model=model, prompt="hi", max_tokens=30000, stream=True, extra_body={"ignore_eos": True}
        )
        try:
            for _ in stream:
                if not first.is_set():
                    trio.from_thread.run_sync(first.set)
        except (openai.APIError, httpx.HTTPError) as exc:
            return exc
    return None


async def test_a_node_killed_mid_stream_costs_only_its_requests_and_its_models_come_back(
    tmp_path: Path, catalogues: list[Path], haproxy_path: Path
) -> None:
    async with cluster(tmp_path, catalogues, haproxy_path) as stack:
        victim, successor = stack.order("tiny-b")[:2]
        node, _ = await trio.to_thread.run_sync(_chat, stack.url, "tiny-b")
        assert node == victim.name
        others = [m for m in ("tiny-a", "tiny-c") if stack.order(m)[0] is not victim]
        for model in others:
            await trio.to_thread.run_sync(_chat, stack.url, model)
        # Every child the victim runs (tiny-b's, and any other model homed there).
        victims_models = (await stack.own_models(victim)).values()
        children = [m["troupe"]["pid"] for m in victims_models if m["troupe"]["pid"]]
        assert children

        first = trio.Event()
        outcome: list[BaseException | None] = []
        served: list[str] = []

        async def long_stream() -> None:
            outcome.append(
                await trio.to_thread.run_sync(_stream_until_cut, stack.url, "tiny-b", first)
            )

        async def trace(model: str) -> None:
            # Requests for models whose home is another node go on, all answered.
            for _ in range(10):
                node, text = await trio.to_thread.run_sync(_chat, stack.url, model)
                assert text
                served.append(node)

        with trio.fail_after(60):  # nothing hangs
            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_stream)
                await first.wait()
                await stack.kill(victim)
                for model in others:
                    nursery.start_soon(trace, model)
        assert outcome != [None]  # the stream in flight on the dead node got an error
        assert victim.name not in served
        assert len(served) == 10 * len(others)

        # Its models go to the next node at once: a connection refused is retried
        # elsewhere (retry-on conn-failure), and the health check takes it out.
        node, text = await trio.to_thread.run_sync(_chat, stack.url, "tiny-b")
        assert (node, bool(text)) == (successor.name, True)
        await stack.wait_status(victim.name, "DOWN")
        node, _ = await trio.to_thread.run_sync(_chat, stack.url, "tiny-b")
        assert node == successor.name
        assert successor.name in await stack.loaded_on("tiny-b")

        # No orphan: the dead node's children exit (each stops at stdin EOF).
        with trio.fail_after(30):
            # Another process's exit has no event here: its table entry is read.
            while any(_alive(pid) for pid in children):  # noqa: ASYNC110
                await trio.sleep(0.05)
        # Nothing left in flight on the nodes that lived.
        for node_ in stack.nodes:
            if node_ is not victim:
                models = await stack.own_models(node_)
                assert all(m["troupe"]["in_flight"] == 0 for m in models.values())

        # The node comes back on its port: once its health check passes, its models
        # return to it.
        await stack.start(victim)
        await stack.wait_status(victim.name, "UP")
        node, text = await trio.to_thread.run_sync(_chat, stack.url, "tiny-b")
        assert (node, bool(text)) == (victim.name, True)
        assert victim.name in await stack.loaded_on("tiny-b")


def _stream_to_end(url: str, model: str, tokens: int, first: trio.Event) -> str:
    """A long stream read to its end: its finish reason."""
    reason = ""
    with _client(url) as client:
        stream = client.completions.create(
            model=model,
            prompt="hi",
            max_tokens=tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            if not first.is_set():
                trio.from_thread.run_sync(first.set)
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
    return reason


async def test_a_fourth_node_joins_by_one_line_and_a_reload_drops_no_connection(
    tmp_path: Path, catalogues: list[Path], haproxy_path: Path
) -> None:
    # The fourth is a small box: its catalogue has only tiny-d, which no other node has.
    small = tmp_path / "small"
    write_tiny_models(small, [TinyModel("tiny-d", seed=3, n_ctx=CTX)])
    async with cluster(tmp_path, catalogues, haproxy_path) as stack:
        first = trio.Event()
        reasons: list[str] = []

        async def long_stream() -> None:
            reasons.append(
                await trio.to_thread.run_sync(_stream_to_end, stack.url, "tiny-a", 6000, first)
            )

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_stream)
                await first.wait()  # in flight through the old configuration
                fourth = stack.new_node(small)
                await stack.start(fourth)
                stack.write_nodes()  # one line more in the node list
                await stack.reload()  # render again, then a graceful reload
                await stack.wait_status(fourth.name, "UP")
        assert reasons == ["length"]  # the stream went on to its end across the reload

        # Every model on its home as the four nodes place it: tiny-d on the fourth.
        assert stack.order("tiny-d") == [fourth]
        for model in ("tiny-a", "tiny-b", "tiny-c", "tiny-d"):
            node, text = await trio.to_thread.run_sync(_chat, stack.url, model)
            assert (node, bool(text)) == (stack.order(model)[0].name, True)
        # The nodes read the list again within a moment; the union then has tiny-d.
        async with httpx.AsyncClient(timeout=30) as http:
            with trio.fail_after(20):
                # Their list is re-read every 2 s: no event to wait on from here.
                while "tiny-d" not in await _listed(http, stack.url):  # noqa: ASYNC110
                    await trio.sleep(0.2)


async def _listed(http: httpx.AsyncClient, url: str) -> list[str]:
    return [m["id"] for m in (await http.get(url + "/v1/models")).json()["data"]]


async def test_a_model_spills_to_its_next_node_only_while_its_home_is_full(
    tmp_path: Path, catalogues: list[Path], haproxy_path: Path
) -> None:
    # --maxconn-per-model 1: a second request for a model while one is in flight on its
    # home goes to the next node; once the home is free again, back to the home.
    async with cluster(tmp_path, catalogues[:2], haproxy_path, maxconn=1) as stack:
        home, spill = stack.order("tiny-a")
        node, _ = await trio.to_thread.run_sync(_chat, stack.url, "tiny-a")
        assert node == home.name
        first = trio.Event()
        reasons: list[str] = []

        async def long_stream() -> None:
            reasons.append(
                await trio.to_thread.run_sync(_stream_to_end, stack.url, "tiny-a", 6000, first)
            )

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_stream)
                await first.wait()  # the home's one slot for tiny-a is taken
                node, text = await trio.to_thread.run_sync(_chat, stack.url, "tiny-a")
                assert (node, bool(text)) == (spill.name, True)
        assert reasons == ["length"]
        node, _ = await trio.to_thread.run_sync(_chat, stack.url, "tiny-a")
        assert node == home.name
        assert sorted(await stack.loaded_on("tiny-a")) == sorted([home.name, spill.name])
