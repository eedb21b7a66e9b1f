"""What the real engine will not do on demand, through the Ollama API: a child that
dies mid-answer (the fake engine's ``crash-after``), a load slow enough to fill the
queue (``load-time``). The client talking is the official ``ollama`` client; the fake
engine only injects the fault. The same queue, limits and CORS as the OpenAI routes."""

from __future__ import annotations

import json
from functools import partial

import ollama
import pytest
import trio

from troupe.service import shutdown
from troupe_rig.router import RouterFactory


async def test_a_child_that_dies_mid_stream_ends_it_with_ollamas_error_line(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-crash-after": "3"}}) as router:
        api = ollama.AsyncClient(host=router.url, timeout=60)
        try:
            parts: list[ollama.ChatResponse] = []

            async def read() -> None:
                stream = await api.chat(
                    model="a", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                async for part in stream:
                    parts.append(part)  # kept as they come, until the error

            with pytest.raises(ollama.ResponseError) as err:
                await read()
            assert "closed the connection" in err.value.error
            assert parts  # some pieces came first
            assert all(not p.done for p in parts)  # never a last object: the answer is cut
            with pytest.raises(ollama.ResponseError) as whole:
                await api.chat(model="a", messages=[{"role": "user", "content": "hi"}])
            assert whole.value.status_code == 500
            with trio.fail_after(10):  # both leases given back
                await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)
        finally:
            await api.close()


async def test_the_queue_limits_and_timeout_answer_in_ollamas_shape(
    fake_router: RouterFactory,
) -> None:
    sections = {"slow": {"fake-load-time": "30"}, "b": {}}
    async with fake_router(sections, "--queue-max", "1", "--queue-timeout", "1") as router:
        api = ollama.AsyncClient(host=router.url, timeout=60)
        try:
            async with trio.open_nursery() as nursery:
                timed_out: list[ollama.ResponseError] = []

                async def first() -> None:
                    try:
                        await api.generate(model="slow", prompt="x")
                    except ollama.ResponseError as exc:
                        timed_out.append(exc)

                nursery.start_soon(first)
                with trio.fail_after(10):
                    await router.ctx.scheduler.wait_until(lambda s: s.models["slow"].waiting == 1)
                with pytest.raises(ollama.ResponseError) as full:
                    await api.chat(model="b", messages=[{"role": "user", "content": "x"}])
                assert full.value.status_code == 503
                assert "--queue-max 1" in full.value.error
            (late,) = timed_out
            assert late.status_code == 503
            assert "timed out after 1 s waiting for model slow" in late.error
            assert router.ctx.scheduler.snapshot.models["slow"].waiting == 0
        finally:
            await api.close()


async def test_cors_and_a_client_that_leaves_the_queue(fake_router: RouterFactory) -> None:
    async with (
        fake_router({"slow": {"fake-load-time": "30"}}) as router,
        router.client() as http,
    ):
        origin = {"Origin": "http://localhost:5173"}
        tags = await http.get("/api/tags", headers=origin)
        openai = await http.get("/v1/models", headers=origin)
        assert tags.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert (
            tags.headers["access-control-allow-origin"]
            == (openai.headers["access-control-allow-origin"])
        )
        pre = await http.options(
            "/api/chat",
            headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"},
        )
        assert pre.status_code == 200
        assert "POST" in pre.headers["access-control-allow-methods"]
        scheduler = router.ctx.scheduler
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(http.post, "/api/generate", json={"model": "slow", "prompt": "x"})
            )
            with trio.fail_after(10):
                await scheduler.wait_until(lambda s: s.models["slow"].waiting == 1)
            nursery.cancel_scope.cancel()  # the client gives up while the model loads
        with trio.fail_after(10):  # its wait left the queue
            await scheduler.wait_until(lambda s: s.models["slow"].waiting == 0)


async def test_a_stream_cut_by_shutdown_ends_with_an_error_line(fake_router: RouterFactory) -> None:
    lines: list[dict[str, object]] = []
    body = {"model": "a", "messages": [{"role": "user", "content": "x"}],
            "options": {"num_predict": 10_000}}  # fmt: skip
    async with (
        fake_router({"a": {"fake-tps": "20"}}, "--drain-timeout", "0.2") as router,
        router.client() as http,
        trio.open_nursery() as nursery,
    ):
        first = trio.Event()

        async def read() -> None:
            async with http.stream("POST", "/api/chat", json=body) as resp:
                async for line in resp.aiter_lines():
                    lines.append(json.loads(line))
                    first.set()

        nursery.start_soon(read)
        with trio.fail_after(10):
            await first.wait()
        with trio.fail_after(30):
            await shutdown(router.ctx)  # past the drain: the stream is cut, with a last word
    assert lines[-1] == {"error": "the router is shutting down"}
    assert all(line["done"] is False for line in lines[:-1])


async def test_bad_requests_get_ollamas_400_never_a_traceback(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        cases = [
            ("POST", "/api/chat", b"{not json"),
            ("POST", "/api/chat", b"[1, 2]"),
            ("POST", "/api/chat", b'{"messages": []}'),
            ("POST", "/api/chat", b'{"model": "a", "messages": "hi"}'),
            ("POST", "/api/chat", b'{"model": "a", "messages": [{"role": "user"}], "format": 7}'),
            ("POST", "/api/generate", b'{"model": "a", "prompt": 5}'),
            ("POST", "/api/generate", b'{"model": "a", "prompt": "x", "keep_alive": "soon"}'),
            ("POST", "/api/generate", b'{"model": "a", "prompt": "x", "options": [1]}'),
            ("POST", "/api/embed", b'{"model": "a", "input": [1]}'),
            ("POST", "/api/show", b"{}"),
            ("DELETE", "/api/delete", b""),
            ("POST", "/api/pull", b'{"model": "llama3.2"}'),
            ("POST", "/api/pull", b'{"model": ""}'),
        ]
        for method, path, body in cases:
            resp = await http.request(method, path, content=body)
            assert resp.status_code == 400, (path, body, resp.text)
            error = resp.json()["error"]
            assert isinstance(error, str), (path, body)
            assert error, (path, body)
        pull = await http.post("/api/pull", json={"model": "llama3.2"})
        assert "org/repo[:TAG]" in pull.json()["error"]
        assert router.snapshot.running == 0  # none of it loaded anything
