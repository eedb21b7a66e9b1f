"""What the dashboard reads besides /models: each child's own memory in the history
(not the whole machine's), and the live tokens per second of the streams relayed now."""

from __future__ import annotations

import json

import psutil
import trio

from troupe.sched import Status
from troupe_rig.router import RouterFactory


def _samples(text: str, name: str) -> dict[str, float]:
    """``{model: value}`` of one metric family's samples."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            model = next(p.split("=", 1)[1].strip('"') for p in labels.split(",") if "model=" in p)
            out[model] = float(value)
    return out


async def test_history_holds_each_childs_memory(fake_router: RouterFactory) -> None:
    async with fake_router({"alpha": {}, "beta": {}}) as router, router.client() as http:
        assert (await http.post("/models/load", json={"model": "alpha"})).status_code == 200
        await router.wait_for_status("alpha", Status.LOADED)
        pid = router.snapshot.models["alpha"].pid
        assert pid
        before = len(router.ctx.history.points())
        await router.ctx.history.wait_for(before + 1)
        points = (await http.get("/troupe/history")).json()["points"]
    last = points[-1]
    # The child's own RSS (read from /proc), by model; beta has no child, so no entry.
    assert set(last["models"]) == {"alpha"}
    rss = psutil.Process(pid).memory_info().rss if psutil.pid_exists(pid) else 0
    held = last["models"]["alpha"]["host"]
    assert held > 1 << 20  # a Python process: megabytes, not the machine's gigabytes
    assert rss == 0 or held < 4 * rss
    assert held < last["memory_used"]["host"]  # the machine's figure is still there, apart


async def test_metrics_show_a_streams_tokens_per_second(fake_router: RouterFactory) -> None:
    sections = {"alpha": {"fake-tps": "50"}}
    async with fake_router(sections) as router, router.client() as http:
        body = {"model": "alpha", "prompt": "hello", "n_predict": 100000, "stream": True}
        async with http.stream("POST", "/completion", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()  # (one iterator: leaving it early closes the stream)
            seen = 0
            while seen < 10:
                line = await anext(lines)
                if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                    seen += 1
            text = (await http.get("/metrics")).text
            assert _samples(text, "troupe_model_streams") == {"alpha": 1.0}
            speed = _samples(text, "troupe_model_stream_tokens_per_second")["alpha"]
            assert 5 < speed < 500  # the fake sends 50 tokens/s (a generous bound)
        with trio.fail_after(10):  # the request ends once the relay sees the client gone
            await router.ctx.requests.wait_until(lambda r: r.path == "/completion")
        text = (await http.get("/metrics")).text
        assert "alpha" not in _samples(text, "troupe_model_streams")
        assert "alpha" not in _samples(text, "troupe_model_stream_tokens_per_second")


async def test_metrics_show_an_ollama_streams_tokens_per_second(
    fake_router: RouterFactory,
) -> None:
    """Open WebUI's Ollama connection streams /api/chat: counted as the OpenAI routes."""
    async with fake_router({"alpha": {"fake-tps": "50"}}) as router, router.client() as http:
        body = {
            "model": "alpha",
            "messages": [{"role": "user", "content": "hello"}],
            "options": {"num_predict": 100000},
        }
        async with http.stream("POST", "/api/chat", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            for _ in range(10):
                assert json.loads(await anext(lines))["message"]["content"]
            text = (await http.get("/metrics")).text
            assert _samples(text, "troupe_model_streams") == {"alpha": 1.0}
            speed = _samples(text, "troupe_model_stream_tokens_per_second")["alpha"]
            assert 5 < speed < 500
        with trio.fail_after(10):
            await router.ctx.requests.wait_until(lambda r: r.path == "/api/chat")
        text = (await http.get("/metrics")).text
        assert "alpha" not in _samples(text, "troupe_model_streams")


async def test_childs_memory_is_shown_with_memory_admission_off(
    fake_router: RouterFactory,
) -> None:
    """--models-memory-margin off reads no device, but the chart still gets each child's
    RSS, live (GET /metrics) and in the history."""
    async with (
        fake_router({"alpha": {}}, "--models-memory-margin", "off") as router,
        router.client() as http,
    ):
        assert (await http.post("/models/load", json={"model": "alpha"})).status_code == 200
        await router.wait_for_status("alpha", Status.LOADED)
        await router.ctx.history.wait_for(len(router.ctx.history.points()) + 1)
        text = (await http.get("/metrics")).text
        points = (await http.get("/troupe/history")).json()["points"]
    assert _samples(text, "troupe_model_memory_observed_bytes")["alpha"] > 1 << 20
    assert points[-1]["models"]["alpha"]["host"] > 1 << 20
