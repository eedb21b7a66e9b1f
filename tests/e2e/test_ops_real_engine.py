"""Operations with the real llama-server: its own metrics merged into troupe's, its log
streamed, JSON logs and the ready line of a troupe process."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from troupe.sched import Snapshot, Status
from troupe_rig.process import start_troupe
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

CHILD_ARGS = ("--ctx-size", "256", "--parallel", "1")


async def sse_events(lines: AsyncIterator[str], count: int) -> list[dict[str, Any]]:
    """The next ``count`` data events of an SSE stream's lines."""
    out: list[dict[str, Any]] = []
    async for line in lines:
        if line.startswith("data: "):
            out.append(json.loads(line[6:]))
            if len(out) == count:
                break
    return out


def _both_settled_apart(snap: Snapshot) -> bool:
    views = [snap.models[m] for m in ("tiny-a", "tiny-b")]
    if any(v.status is not Status.LOADED or v.stopping for v in views):
        return False
    a, b = (v.cpu for v in views)
    return a is None or b is None or set(a.cpus).isdisjoint(b.cpus)


async def test_child_metrics_are_merged_and_labelled_and_its_log_streams(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        open_router(
            ["--models-dir", str(tiny_model_dir), *CHILD_ARGS, "--metrics"],
            engine=engine_path,
            state_dir=tmp_path / "state",
            cwd=tmp_path,
        ) as router,
        router.client() as http,
    ):
        await router.ctx.scheduler.load("tiny-b")
        await router.wait_for_status("tiny-b", Status.LOADED)
        body = {"model": "tiny-a", "prompt": "hello", "n_predict": 4}
        assert (await http.post("/completion", json=body)).status_code == 200
        # tiny-b was started alone on every core; beside tiny-a it is started again on a
        # lane of its own (CPU placement), so its counters start again from zero.
        with trio.fail_after(60):
            await router.ctx.scheduler.wait_until(_both_settled_apart)

        resp = await http.get("/metrics")
        assert resp.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(resp.text)}
        up = {s.labels["model"]: s.value for s in families["troupe_child_metrics_up"].samples}
        assert up == {"tiny-a": 1, "tiny-b": 1}
        # llama-server's own counters, one family, one sample per model.
        tokens = families["llamacpp:tokens_predicted"]
        assert tokens.type == "counter"
        per_model = {s.labels["model"]: s.value for s in tokens.samples}
        assert per_model == {"tiny-a": 4, "tiny-b": 0}
        assert all("model" in s.labels for f in families.values() if f.name.startswith("llamacpp:")
                   for s in f.samples)  # fmt: skip

        # With ?model= it is the child's own exposition, as upstream.
        own = await http.get("/metrics", params={"model": "tiny-a"})
        assert own.status_code == 200
        child = {f.name: f for f in text_string_to_metric_families(own.text)}
        assert [s.value for s in child["llamacpp:tokens_predicted"].samples] == [4]
        assert "troupe_model_status" not in child

        # The model's log: what its child printed, then a line for each new one.
        async with (
            http.stream("GET", "/logs/stream", params={"model": "tiny-a"}) as stream,
            contextlib.aclosing(stream.aiter_lines()) as lines,
        ):
            history = router.ctx.logs.recent("tiny-a")
            first = await sse_events(lines, len(history))
            assert [e["text"] for e in first] == [ln.text for ln in history]
            assert first[0] == {**first[0], "source": "troupe", "text": "loading: starting a child"}
            assert any(e["source"] == "child" and "llama" in e["text"] for e in first)
            assert {e["model"] for e in first} == {"tiny-a"}
            await router.ctx.scheduler.unload("tiny-a")
            said: list[str] = []
            with trio.fail_after(30):
                while len(said) < 2:
                    (line,) = await sse_events(lines, 1)
                    assert line["seq"] > first[-1]["seq"]
                    if line["source"] == "troupe":
                        said.append(line["text"])
            assert said == ["stopping (unload request)", "stopped (exit code 0)"]


async def test_json_logs_tag_the_childs_lines_and_say_ready(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    troupe = await start_troupe(
        [
            "--engine",
            str(engine_path),
            "--models-dir",
            str(tiny_model_dir),
            *CHILD_ARGS,
            "--models-max",
            "2",
            "--log-format",
            "json",
        ],
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    )
    try:
        async with httpx.AsyncClient(base_url=troupe.url, timeout=60) as http:
            await troupe.read_log_until(b'"message": "ready:')
            body = {"model": "tiny-c", "prompt": "hi", "n_predict": 2}
            assert (await http.post("/completion", json=body)).status_code == 200
            await troupe.read_log_until(b'"model": "tiny-c"')
            await troupe.read_log_until(b"loaded")
    finally:
        troupe.process.terminate()
        with trio.fail_after(30):
            await troupe.drain_log()
            await troupe.process.wait()
    lines = [json.loads(line) for line in troupe.log.decode().splitlines()]
    assert all(set(ln) >= {"time", "level", "logger", "model", "message"} for ln in lines)
    ready = [ln for ln in lines if ln["message"].startswith("ready:")]
    assert len(ready) == 1
    assert ready[0]["message"].startswith(
        "ready: 3 models (tiny-a, tiny-b, tiny-c); models-max 2; memory margin 1024 MiB;"
    )
    assert f"listening on {troupe.url}" in ready[0]["message"]
    assert f"dashboard {troupe.url}/troupe/" in ready[0]["message"]
    child = [ln for ln in lines if ln["logger"] == "troupe.child" and ln["model"] == "tiny-c"]
    assert child
    assert not any(ln["message"].startswith("[tiny-c]") for ln in child)
    # troupe's own lines about the model carry it too, not a dict repr or a prefix.
    about_c = {ln["logger"]: ln["message"] for ln in lines if ln["model"] == "tiny-c"}
    assert about_c["troupe.instance"].startswith("stopped")
    assert about_c["troupe.scheduler"] == "stopping (shutdown)"
    assert any(ln["message"].startswith("spawned (pid ") for ln in lines if ln["model"] == "tiny-c")
    alone = [ln for ln in lines if "tiny-c" in ln["message"] and "tiny-a" not in ln["message"]]
    assert [ln["message"] for ln in alone if ln["model"] is None] == []
    assert troupe.process.returncode == 0
