"""The access record with the real llama-server: the log line, the ring behind
``GET /troupe/requests`` and the per-model histograms, for a plain and a streamed
request, one that queued, one whose model failed to load, and one whose client left."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from troupe.ops.access import AccessRecord
from troupe.ops.logformat import JsonFormatter
from troupe.sched import Snapshot, Status
from troupe_rig.router import open_router, write_preset

pytestmark = pytest.mark.engine

CHILD_ARGS = ("--ctx-size", "256", "--parallel", "1")


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_records_metrics_and_log_lines(
    engine_path: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # "broken": a file that is no GGUF, which the engine fails to load (a flag it would
    # refuse is refused before any request now: tests/e2e/test_section_flags_real_engine.py).
    garbage = tmp_path / "broken.gguf"
    garbage.write_bytes(b"GGUF" + b"\xff" * 4096)
    preset = write_preset(tmp_path, {"broken": {"model": str(garbage)}})
    args = [
        "--models-dir",
        str(tiny_model_dir),
        "--models-preset",
        str(preset),
        "--models-max",
        "1",
        "--drain-after",
        "off",
        "--access-log",
        "on",
        *CHILD_ARGS,
    ]
    caplog.set_level(logging.INFO, logger="troupe.access")
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "state", cwd=tmp_path) as r,
        r.client() as http,
    ):
        requests = r.ctx.requests
        # A plain request: its model loads on the way (a load wait), usage from the body.
        body = json.dumps({"model": "tiny-a", "prompt": "hello", "n_predict": 4}).encode()
        assert (await http.post("/completion", content=body)).status_code == 200
        plain = await requests.wait_until(lambda rec: rec.path == "/completion")
        assert (plain.model, plain.status, plain.stream) == ("tiny-a", 200, False)
        assert plain.completion_tokens == 4
        assert plain.prompt_tokens is not None
        assert plain.prompt_tokens > 0
        assert plain.tokens_per_second is not None
        assert plain.load_wait is not None
        assert plain.load_wait > 0
        assert plain.ttfb is not None
        assert plain.ttfb <= plain.duration
        assert plain.bytes_in == len(body)
        assert plain.bytes_out > 0
        assert plain.error is None

        # A stream: the first event's time, tokens from the last event's timings.
        stream_body = {"model": "tiny-a", "prompt": "hi", "n_predict": 6, "stream": True}
        async with http.stream("POST", "/completion", json=stream_body) as resp:
            assert resp.status_code == 200
            text = "".join([chunk async for chunk in resp.aiter_text()])
        assert "timings" in text
        streamed = await requests.wait_until(lambda rec: rec.stream)
        assert (streamed.model, streamed.status, streamed.completion_tokens) == ("tiny-a", 200, 6)
        assert streamed.ttft is not None
        assert streamed.load_wait == 0
        assert streamed.tokens_per_second is not None

        # Queued: tiny-a is held busy (a lease), so tiny-b waits for the one slot.
        rid, _grant = await r.ctx.scheduler.acquire("tiny-a", autoload=True, update_last_used=True)

        def b_waits(snap: Snapshot) -> bool:
            view = snap.models.get("tiny-b")
            return view is not None and view.waiting > 0

        async with trio.open_nursery() as nursery:
            b_body = {"model": "tiny-b", "prompt": "x", "n_predict": 2}
            nursery.start_soon(partial(http.post, "/completion", json=b_body))
            with trio.fail_after(30):
                await r.ctx.scheduler.wait_until(b_waits)
            await r.ctx.scheduler.release(rid)
        queued = await requests.wait_until(lambda rec: rec.model == "tiny-b")
        assert queued.status == 200
        assert queued.queue_wait is not None
        assert queued.queue_wait > 0
        assert queued.load_wait is not None
        assert queued.load_wait > 0

        # A model that fails to load: the failure and its reason.
        failed = await http.post("/completion", json={"model": "broken", "prompt": "x"})
        assert failed.status_code >= 500
        broken = await requests.wait_until(lambda rec: rec.model == "broken")
        assert broken.status == failed.status_code
        assert broken.error
        assert broken.completion_tokens is None

        # A client that leaves mid-stream: what it got, and why it ended.
        long_body = {"model": "tiny-b", "prompt": "go", "n_predict": 200, "stream": True}
        async with http.stream("POST", "/completion", json=long_body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    break
        left = await requests.wait_until(lambda rec: rec.error == "the client went away")
        assert (left.model, left.status, left.stream) == ("tiny-b", 200, True)

        ring = (await http.get("/troupe/requests", params={"model": "tiny-a"})).json()["data"]
        assert [item["stream"] for item in ring] == [True, False]  # newest first
        assert ring[1]["completion_tokens"] == 4
        everything = (await http.get("/troupe/requests")).json()["data"]
        assert len(everything) == 5

        metrics = (await http.get("/metrics")).text

    durations = _samples(metrics, "troupe_request_duration_seconds_count")
    by_model: dict[str, float] = {}
    for labels, count in durations.items():
        model = dict(labels)["model"]
        by_model[model] = by_model.get(model, 0) + count
    assert by_model == {"tiny-a": 2, "tiny-b": 2, "broken": 1}
    first = _samples(metrics, "troupe_request_first_token_seconds_count")
    assert first[(("model", "tiny-a"), ("route", "/completion"), ("status", "200"))] == 2
    completion = _samples(metrics, "troupe_completion_tokens_total")
    assert completion[(("model", "tiny-a"),)] == 10
    prompt = _samples(metrics, "troupe_prompt_tokens_total")
    assert prompt[(("model", "tiny-a"),)] == plain.prompt_tokens + (streamed.prompt_tokens or 0)
    assert _samples(metrics, "troupe_swaps_total")[()] >= 1  # tiny-a made room for tiny-b
    assert not any(f.name.endswith("_created") for f in text_string_to_metric_families(metrics))

    # The log line: one per request, text by default and the same record as JSON.
    lines = [rec for rec in caplog.records if rec.name == "troupe.access"]
    local = [rec for rec in lines if rec.access.kind == "local"]  # type: ignore[attr-defined]
    assert [rec.access.path for rec in local] == ["/troupe/requests"] * 2  # type: ignore[attr-defined]
    lines = [rec for rec in lines if rec not in local]
    assert len(lines) == 5
    first_line = lines[0]
    assert '"POST /completion" 200 model=tiny-a' in first_line.getMessage()
    assert "tokens=" in first_line.getMessage()
    as_json = json.loads(JsonFormatter().format(first_line))
    assert as_json["model"] == "tiny-a"
    assert as_json["request"]["completion_tokens"] == 4
    assert isinstance(getattr(first_line, "access", None), AccessRecord)


async def test_version(engine_path: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    async with (
        open_router(
            ["--models-dir", str(tiny_model_dir)], engine=engine_path, state_dir=tmp_path / "s"
        ) as r,
        r.client() as http,
    ):
        got = (await http.get("/troupe/version")).json()
    assert got["troupe"]
    assert got["engine"]["path"] == str(engine_path)
    assert r.status("tiny-a") is Status.UNLOADED
