"""A streamed request that waits for its model to load gets its head at once, the
load's progress (SSE comments, or reasoning_content deltas), then the child's tokens;
a failure after the head ends the stream with llama-server's error event; ``troupe ps``
shows the percentage (`troupe.http.loading`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import openai
import pytest
import trio

from troupe.commands.ps import ps_rows, run_ps
from troupe.ops.load_log import load_percent
from troupe.sched import Status
from troupe_rig.router import RouterFactory, RunningRouter

LOAD = "3"  # seconds the fake engine takes to load (progress every step of it)


async def _events(resp: httpx.Response) -> list[str]:
    """The stream's SSE blocks (comments and data), as sent."""
    text = ""
    async for piece in resp.aiter_text():
        text += piece
    return [block for block in text.split("\n\n") if block]


async def _wait_progress(router: RunningRouter, model: str) -> None:
    def moved(snapshot: object) -> bool:
        view = router.snapshot.models.get(model)
        value = (view.progress or {}).get("value") if view is not None else None
        return isinstance(value, float) and value > 0.0

    with trio.fail_after(30):
        await router.ctx.scheduler.wait_until(moved)


async def test_streamed_chat_gets_head_then_progress_then_tokens(
    fake_router: RouterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "gate"  # the load ends when the test says (after some progress)
    sections = {"slow": {"fake-load-time": LOAD, "fake-load-gate": str(gate)}}
    async with fake_router(sections) as router, router.client() as http:
        body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        asked = trio.current_time()
        async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            headed = trio.current_time() - asked
            # The head came while the model was still loading, long before its 3 s load.
            assert router.status("slow") is not Status.LOADED
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert headed < 1.0
            await _wait_progress(router, "slow")
            # troupe ps shows the percentage of the load under way.
            models = (await http.get("/models")).json()["data"]
            (row,) = [r for r in ps_rows(models) if r["name"] == "slow"]
            assert row["status"] == "loading"
            assert isinstance(row["percent"], int)
            assert 0 <= row["percent"] <= 100
            assert await trio.to_thread.run_sync(run_ps, ["--url", router.url]) == 0
            (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("slow")]
            assert line.split()[1] == "loading"
            assert line.split()[2].endswith("%")  # the STATUS column: "loading 40%"
            gate.touch()
            blocks = await _events(resp)
    comments = [b for b in blocks if b.startswith(":")]
    data = [b.removeprefix("data: ") for b in blocks if b.startswith("data: ")]
    assert comments
    assert all(c.startswith(": ") for c in comments)
    assert any(c.startswith(": loading slow ") and c.endswith("%") for c in comments)
    first_data = blocks.index(next(b for b in blocks if b.startswith("data: ")))
    assert all(b.startswith(":") for b in blocks[:first_data])  # progress, then tokens
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text  # the child's own tokens, in the same stream


def _sdk_chat(url: str, model: str) -> tuple[list[str], list[str]]:
    """(reasoning_content deltas, content deltas) of a streamed chat, read by the
    ``openai`` SDK."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    reasoning: list[str] = []
    content: list[str] = []
    with (
        client,
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        ) as stream,
    ):
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            extra = (delta.model_extra or {}).get("reasoning_content")
            if extra:
                reasoning.append(extra)
            if delta.content:
                content.append(delta.content)
    return reasoning, content


def _sdk_completion(url: str, model: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    with (
        client,
        client.completions.create(model=model, prompt="hi", stream=True, max_tokens=4) as stream,
    ):
        return "".join(c.choices[0].text for c in stream if c.choices)


async def test_openai_sdk_reads_progress_as_reasoning(fake_router: RouterFactory) -> None:
    sections = {"slow": {"fake-load-time": LOAD}}
    async with fake_router(sections, "--load-progress", "reasoning") as router:
        reasoning, content = await trio.to_thread.run_sync(_sdk_chat, router.url, "slow")
    assert any(r.startswith("loading slow ") and r.endswith("%\n") for r in reasoning)
    assert "".join(content)  # then the child's tokens


async def test_openai_sdk_parses_comments(fake_router: RouterFactory) -> None:
    async with fake_router({"slow": {"fake-load-time": "1"}}) as router:
        text = await trio.to_thread.run_sync(_sdk_completion, router.url, "slow")
        reasoning, content = await trio.to_thread.run_sync(_sdk_chat, router.url, "slow")
    assert text
    assert not reasoning  # comments: nothing but the child's own deltas
    assert "".join(content)


async def test_load_failure_after_head_is_an_error_event(fake_router: RouterFactory) -> None:
    sections = {"broken": {"fake-load-time": LOAD, "fake-load-crash": "3"}}
    async with fake_router(sections) as router, router.client() as http:
        body = {"model": "broken", "prompt": "hi", "stream": True}
        async with http.stream("POST", "/completion", json=body) as resp:
            assert resp.status_code == 200  # the head went out before the load failed
            blocks = await _events(resp)
        rec = await router.ctx.requests.wait_until(lambda r: r.model == "broken")
    data = [b.removeprefix("data: ") for b in blocks if b.startswith("data: ")]
    assert "[DONE]" not in data  # as llama-server ends a failed stream
    (last,) = [json.loads(d) for d in data]
    assert last["error"]["code"] == 500
    assert "failed to load" in last["error"]["message"]
    assert rec.error is not None
    assert "failed to load" in rec.error


async def test_queue_timeout_after_head_and_not_streamed_unchanged(
    fake_router: RouterFactory,
) -> None:
    async with (
        fake_router({"slow": {"fake-load-time": "30"}}, "--queue-timeout", "1") as router,
        router.client() as http,
    ):
        body = {"model": "slow", "prompt": "hi", "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            blocks = await _events(resp)
        error = json.loads(blocks[-1].removeprefix("data: "))["error"]
        assert error["code"] == 503
        assert "timed out after 1 s" in error["message"]
        # Without "stream": true the answer is what it always was.
        plain = await http.post("/v1/completions", json={"model": "slow", "prompt": "hi"})
        assert plain.status_code == 503
        assert "timed out" in plain.json()["error"]["message"]


async def test_off_sends_nothing_before_the_child(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    sections = {"slow": {"fake-load-time": "0.5", "fake-load-gate": str(gate)}}
    async with (
        fake_router(sections, "--load-progress", "off") as router,
        router.client() as http,
        trio.open_nursery() as nursery,
    ):
        body = {"model": "slow", "prompt": "hi", "stream": True}
        headed = trio.Event()

        async def ask() -> None:
            async with http.stream("POST", "/completion", json=body) as resp:
                headed.set()
                await resp.aread()

        nursery.start_soon(ask)
        await _wait_progress(router, "slow")
        with trio.move_on_after(0.5):
            await headed.wait()
        assert not headed.is_set()  # no head while the model loads
        gate.touch()
        with trio.fail_after(30):
            await headed.wait()


@pytest.mark.parametrize(
    ("progress", "percent"),
    [
        ({"stages": ["text_model"], "current": "text_model", "value": 0.4}, 40),
        ({"stages": ["text_model", "mmproj_model"], "current": "mmproj_model", "value": 0.5}, 75),
        ({"value": "x"}, None),
        (None, None),
    ],
)
def test_load_percent(progress: dict[str, object] | None, percent: int | None) -> None:
    assert load_percent(progress) == percent


async def test_ollama_chat_gets_its_head_while_loading_then_lines(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    sections = {"slow": {"fake-load-time": LOAD, "fake-load-gate": str(gate)}}
    async with fake_router(sections) as router, router.client() as http:
        body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}]}
        async with http.stream("POST", "/api/chat", json=body) as resp:
            assert router.status("slow") is not Status.LOADED
            assert resp.status_code == 200
            assert resp.headers["content-type"] == "application/x-ndjson"
            gate.touch()
            lines = [json.loads(line) async for line in resp.aiter_lines() if line]
    assert all("error" not in line for line in lines)
    assert lines[-1]["done"] is True
    assert "".join(line["message"]["content"] for line in lines)


async def test_ollama_load_failure_after_head_is_an_error_line(fake_router: RouterFactory) -> None:
    sections = {"broken": {"fake-load-time": LOAD, "fake-load-crash": "3"}}
    async with fake_router(sections) as router, router.client() as http:
        body = {"model": "broken", "prompt": "hi"}
        async with http.stream("POST", "/api/generate", json=body) as resp:
            assert resp.status_code == 200
            lines = [json.loads(line) async for line in resp.aiter_lines() if line]
        assert router.status("broken") is not Status.LOADED
    (line,) = lines
    assert "failed to load" in line["error"]


async def test_the_log_says_who_starts_a_load_why_it_waits_and_when_ready(
    fake_router: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="troupe.load")
    async with (
        fake_router({"a": {}, "b": {}}, "--models-max", "1") as router,
        router.client() as http,
    ):
        for model in ("a", "b", "b"):
            body = {"model": model, "prompt": "hi", "n_predict": 2}
            assert (await http.post("/completion", json=body)).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "troupe.load"]
    assert lines.count("[a] a request starts its load (1 waiting)") == 1
    assert lines.count("[b] a request starts its load (1 waiting)") == 1
    # b waits for a to stop (models-max 1): said once, not once per request.
    assert lines.count("[b] 1 request(s) wait: waiting for a model to stop") == 1
    assert sum(1 for line in lines if line.startswith("[b] ready in ")) == 1
    assert len(lines) == 5  # the third request, for a ready model, says nothing
