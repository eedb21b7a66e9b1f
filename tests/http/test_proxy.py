"""Proxied requests: model resolution, streaming relay, errors, and that bad input hurts no one."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
import trio

from troupe.sched import Status
from troupe_rig.router import RouterFactory


async def test_streaming_chat_completion_is_relayed_chunk_by_chunk(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-tps": "200"}}) as router, router.client() as http:
        chunks = []
        body = {
            "model": "a",
            "stream": True,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        }
        async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-accel-buffering"] == "no"
            assert resp.headers["server"] == "llama.cpp"
            assert "content-length" not in resp.headers
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
        assert chunks[-1] == "[DONE]"
        deltas = [json.loads(c)["choices"][0]["delta"].get("content") for c in chunks[:-1]]
        assert len([d for d in deltas if d]) == 8
        with trio.fail_after(1):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)


async def test_non_streaming_completion_tokenize_and_props(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"alias": "alpha"}}) as router, router.client() as http:
        resp = await http.post(
            "/completion", json={"model": "alpha", "prompt": "x", "n_predict": 5}
        )
        assert resp.status_code == 200
        assert resp.json()["tokens_predicted"] == 5
        resp = await http.post("/tokenize", json={"model": "a", "content": "hello"})
        assert isinstance(resp.json()["tokens"], list)
        resp = await http.get("/props", params={"model": "a"})
        assert resp.status_code == 200
        assert "role" not in resp.json()  # the child's props, not the router's
        # GET does not count as use.
        used = router.snapshot.models["a"].last_used
        await http.get("/slots", params={"model": "a"})
        assert router.snapshot.models["a"].last_used == used


@pytest.mark.parametrize(
    ("content", "headers", "status", "message"),
    [
        (b"{not json", {}, 400, "invalid JSON in request body"),
        (b'{"model": 42}', {}, 400, "model name is missing from the request"),
        (b'{"prompt": "x"}', {}, 400, "model name is missing from the request"),
        (b'{"model": "nope"}', {}, 400, "model 'nope' not found"),
        (b'{"model": "a\xff"}', {}, 400, "not valid UTF-8"),
        (b"[1, 2]", {}, 400, "model name is missing from the request"),
    ],
)
async def test_bad_requests_get_upstream_shaped_errors(
    fake_router: RouterFactory, content: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.post("/v1/completions", content=content, headers=headers)
        assert resp.status_code == status
        error = resp.json()["error"]
        assert list(error) == ["code", "message", "type"]
        assert error["code"] == status
        assert error["type"] == "invalid_request_error"
        assert message in error["message"]
        assert router.snapshot.running == 0  # nothing was started for a bad request


async def test_body_over_the_limit_is_refused(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--max-body-mib", "1") as router, router.client() as http:
        resp = await http.post(
            "/v1/completions", content=b'{"model":"a","prompt":"' + b"x" * (2 << 20) + b'"}'
        )
        assert resp.status_code == 413
        assert resp.json()["error"]["type"] == "invalid_request_error"
        assert (
            await http.post("/tokenize", json={"model": "a", "content": "ok"})
        ).status_code == 200


async def test_autoload_off_says_not_loaded(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.post(
            "/completion", params={"autoload": "false"}, json={"model": "a", "prompt": "x"}
        )
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "model is not loaded"
    async with fake_router({"a": {}}, "--no-models-autoload") as router, router.client() as http:
        resp = await http.post("/completion", json={"model": "a", "prompt": "x"})
        assert resp.json()["error"]["message"] == "model is not loaded"
        resp = await http.post(
            "/completion", params={"autoload": "1"}, json={"model": "a", "prompt": "x"}
        )
        assert resp.status_code == 200


async def test_multipart_model_field_is_found(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.post(
            "/v1/audio/transcriptions", data={"model": "nope"}, files={"file": ("a.wav", b"RIFF")}
        )
        assert resp.json()["error"]["message"] == "model 'nope' not found"


async def test_bad_input_never_costs_another_client_its_stream(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-tps": "50"}}) as router, router.client() as http:
        got: list[str] = []
        async with trio.open_nursery() as nursery:

            async def good_stream() -> None:
                body = {"model": "a", "stream": True, "max_tokens": 20, "prompt": "x"}
                async with http.stream("POST", "/v1/completions", json=body) as resp:
                    async for line in resp.aiter_lines():
                        if line.startswith("data: "):
                            got.append(line)

            nursery.start_soon(good_stream)
            await router.wait_for_status("a", Status.LOADED)
            for content in (b"{", b'{"model":1}', b'{"model":"zz"}', b"\xff\xfe"):
                assert (await http.post("/v1/completions", content=content)).status_code == 400
        assert got[-1] == "data: [DONE]"
        texts = [json.loads(g[6:])["choices"][0]["text"] for g in got[:-1]]
        assert len([t for t in texts if t]) == 20


async def test_client_disconnect_mid_stream_frees_the_model(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-tps": "20"}}) as router, router.client() as http:
        body = {"model": "a", "stream": True, "max_tokens": 1000, "prompt": "x"}
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            async with contextlib.aclosing(resp.aiter_lines()) as lines:
                async for line in lines:
                    if line.startswith("data: "):
                        break
            assert router.snapshot.models["a"].in_flight == 1
        with trio.fail_after(1):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)


async def test_child_crash_mid_stream_ends_the_stream_with_the_reason(
    fake_router: RouterFactory,
) -> None:
    async with (
        fake_router({"a": {"fake-crash-after": "3", "fake-crash-code": "7"}}) as router,
        router.client() as http,
    ):
        body = {"model": "a", "stream": True, "max_tokens": 10, "prompt": "x"}
        lines = []
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
        error = json.loads(lines[-1])["error"]
        assert "exit code 7" in error["message"]
        snap = await router.wait_for_status("a", Status.UNLOADED)
        assert snap.models["a"].exit_code == 7
        # The next request starts the model again.
        resp = await http.post("/completion", json={"model": "a", "prompt": "x", "n_predict": 2})
        assert resp.status_code == 200


async def test_child_crash_before_answering_is_a_proxy_error(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-crash-after": "0"}}) as router, router.client() as http:
        resp = await http.post("/completion", json={"model": "a", "prompt": "x", "n_predict": 3})
        assert resp.status_code == 500
        assert resp.text.startswith("proxy error:")


async def test_conversation_request_is_cancelled_by_a_stop_while_loading(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-load-time": "30"}}) as router, router.client() as http:
        headers = {"X-Conversation-Id": "conv-1"}
        result: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                result.append(
                    await http.post(
                        "/completion", json={"model": "a", "prompt": "x"}, headers=headers
                    )
                )

            nursery.start_soon(ask)
            await router.wait_for_status("a", Status.LOADING)
            resp = await http.get("/v1/stream", params={"conv_id": "conv-1"})
            assert resp.status_code == 503
            assert resp.json()["error"]["message"] == "Stream owner model is loading, retry later"
            resp = await http.delete("/v1/stream", params={"conv_id": "conv-1"})
            assert resp.status_code == 204
            assert resp.content == b""
        assert result[0].status_code == 400
        assert (
            result[0].json()["error"]["message"]
            == "request cancelled by a stop while the model was loading"
        )
        resp = await http.get("/v1/stream", params={"conv_id": "conv-1"})
        assert resp.status_code == 404
        assert (await http.get("/v1/stream")).status_code == 400


async def test_streams_lookup_with_a_bad_body_is_an_empty_list(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.post("/v1/streams/lookup", content=b"nonsense")
        assert resp.status_code == 200
        assert resp.json() == []
