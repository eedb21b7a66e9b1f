"""Downloads end to end: the loopback hub, troupe, the real llama-server, real clients.

A model downloaded through ``POST /models`` is listed, loads and answers; one cut off
halfway resumes and verifies; a bad checksum leaves nothing listed or linked; an
unload cancels a download; a troupe killed mid-download resumes from its journal; a
model huggingface_hub downloaded loads through troupe.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import huggingface_hub
import openai
import pytest
import trio

from troupe_rig.events import collect_until, drain
from troupe_rig.hub import Fault, Hub
from troupe_rig.process import start_troupe
from troupe_rig.router import RunningRouter, open_router

pytestmark = pytest.mark.engine

MODEL = "m-Q4_K_M.gguf"
NAME = "org/tiny:Q4_K_M"
CHILD_ARGS = ("--ctx-size", "256", "--parallel", "1")


@pytest.fixture
def env(hub: Hub, tiny_files: dict[str, Path], tmp_path: Path) -> dict[str, str]:
    """``org/tiny`` on the hub (model files only: the tiny "mmproj" is no projector),
    the hub as the endpoint, a fresh cache."""
    hub.add_repo("org/tiny", {MODEL: tiny_files[MODEL], "m-Q8_0.gguf": tiny_files["m-Q8_0.gguf"]})
    base = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    return {**base, "MODEL_ENDPOINT": hub.url, "LLAMA_CACHE": str(tmp_path / "cache")}


@asynccontextmanager
async def router_for(
    engine: Path, env: dict[str, str], tmp_path: Path
) -> AsyncIterator[RunningRouter]:
    async with open_router(
        list(CHILD_ARGS), engine=engine, state_dir=tmp_path / "state", environ=env, cwd=tmp_path
    ) as router:
        yield router


def has_bytes(event: dict[str, Any]) -> bool:
    return event["event"] == "download_progress" and any(
        v["done"] for v in event["data"]["progress"].values()
    )


async def sse_until(
    http: httpx.AsyncClient,
    start: Callable[[], Awaitable[None]],
    last: Callable[[dict[str, Any]], bool],
    out: list[dict[str, Any]],
) -> None:
    """Read ``/models/sse`` over HTTP, run ``start`` once subscribed, stop after ``last``."""
    async with http.stream("GET", "/models/sse") as resp, trio.open_nursery() as nursery:
        nursery.start_soon(start)
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if not event["event"].startswith("troupe_"):
                    out.append(event)
                if last(event):
                    return


async def complete(router: RunningRouter, model: str) -> str:
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
    async with client:
        resp = await client.completions.create(model=model, prompt="hello", max_tokens=4)
    return resp.choices[0].text


async def test_a_downloaded_model_is_listed_loads_and_answers(
    engine_path: Path, env: dict[str, str], hub: Hub, tmp_path: Path
) -> None:
    async with router_for(engine_path, env, tmp_path) as router, router.client() as http:
        events: list[dict[str, Any]] = []

        async def post() -> None:
            resp = await http.post("/models", json={"model": "org/tiny"})
            assert resp.json() == {"success": True}

        with trio.fail_after(30):
            await sse_until(http, post, lambda e: e["event"] == "models_reload", events)
        names = [e["event"] for e in events]
        assert names[0] == "model_status"
        assert names[-2:] == ["download_finished", "models_reload"]
        assert set(names[1:-2]) == {"download_progress"}
        ids = [m["id"] for m in (await http.get("/models")).json()["data"]]
        assert ids == [NAME]
        text = await complete(router, NAME)
        assert text.strip()
        assert router.status(NAME) == "loaded"
    info = huggingface_hub.scan_cache_dir(tmp_path / "cache")
    assert info.warnings == []
    assert [f.file_name for r in info.repos for v in r.revisions for f in v.files] == [MODEL]


async def test_a_download_cut_off_halfway_resumes_verifies_and_loads(
    engine_path: Path, env: dict[str, str], hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    size = tiny_files[MODEL].stat().st_size
    hub.fault("org/tiny", MODEL, Fault(drop_at=size // 2))
    async with router_for(engine_path, env, tmp_path) as router, router.client() as http:
        with router.ctx.scheduler.subscribe() as events:
            await http.post("/models", json={"model": NAME})
            got = await collect_until(events, lambda e: e["event"] == "models_reload")
        assert "download_finished" in [e["event"] for e in got]
        gets = hub.gets(MODEL)
        assert [(g.range, g.status) for g in gets] == [
            (None, 200),
            (f"bytes={size // 2}-", 206),
        ]
        assert hub.sent(MODEL) == size
        assert (await complete(router, NAME)).strip()


async def test_a_bad_checksum_fails_and_nothing_is_listed_or_linked(
    engine_path: Path, env: dict[str, str], hub: Hub, tmp_path: Path
) -> None:
    hub.fault("org/tiny", MODEL, Fault(corrupt=True))
    async with router_for(engine_path, env, tmp_path) as router, router.client() as http:
        with router.ctx.scheduler.subscribe() as events:
            await http.post("/models", json={"model": NAME})
            got = await collect_until(events, lambda e: e["event"] == "models_reload")
        failed = next(e for e in got if e["event"] == "download_failed")
        assert "sha256 mismatch" in failed["data"]["reason"]
        assert (await http.get("/models")).json()["data"] == []
        resp = await http.post("/v1/completions", json={"model": NAME, "prompt": "x"})
        assert resp.status_code == 400
    repo = tmp_path / "cache" / "models--org--tiny"
    assert not list(repo.glob("snapshots/**/*.gguf"))
    assert not list(repo.glob("blobs/*"))


async def test_an_unload_cancels_a_download_at_once(
    engine_path: Path, env: dict[str, str], hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.rate = 64_000  # 64 kB/s: the 1.3 MB file would take 20 s
    async with router_for(engine_path, env, tmp_path) as router, router.client() as http:
        with router.ctx.scheduler.subscribe() as events:
            await http.post("/models", json={"model": NAME})
            await collect_until(events, has_bytes)
            resp = await http.post("/models/unload", json={"model": NAME})
            assert resp.json() == {"success": True}
            # Answered once the job has ended: its download_failed was sent before.
            ended = drain(events)
            failed = {"model": NAME, "event": "download_failed", "data": {"reason": "cancelled"}}
            assert failed in ended
            if {"model": "*", "event": "models_reload"} not in ended:
                await collect_until(events, lambda e: e["event"] == "models_reload")
        assert (await http.get("/models")).json()["data"] == []
    assert hub.sent(MODEL) < tiny_files[MODEL].stat().st_size
    assert not (tmp_path / "cache" / "models--org--tiny").exists()


async def test_troupe_killed_mid_download_resumes_from_its_journal(
    engine_path: Path,
    env: dict[str, str],
    hub: Hub,
    tiny_files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = tiny_files[MODEL].stat().st_size
    hub.fault("org/tiny", MODEL, Fault(stall_at=size // 2))
    for key in ("MODEL_ENDPOINT", "LLAMA_CACHE"):
        monkeypatch.setenv(key, env[key])
    args = ["--engine", str(engine_path), *CHILD_ARGS]
    first = await start_troupe(args, state_dir=tmp_path / "state")
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as http:

        async def post() -> None:
            await http.post("/models", json={"model": NAME})

        with trio.fail_after(30):
            await sse_until(http, post, has_bytes, [])
    first.process.send_signal(signal.SIGKILL)  # no shutdown: only the journal remains
    await first.process.wait()
    hub.fault("org/tiny", MODEL, None)
    second = await start_troupe(args, state_dir=tmp_path / "state")
    try:
        await second.read_log_until(f"downloaded {NAME}".encode())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(second.drain_log)
            async with httpx.AsyncClient(base_url=second.url, timeout=60) as http:
                ids = [m["id"] for m in (await http.get("/models")).json()["data"]]
                assert ids == [NAME]
                body = {"model": NAME, "prompt": "hi", "max_tokens": 2}
                resp = await http.post("/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
            nursery.cancel_scope.cancel()
        resumed = hub.gets(MODEL)[-1]
        assert resumed.range is not None
        assert int(resumed.range.removeprefix("bytes=").rstrip("-")) > 0
        assert b"resuming the unfinished download of org/tiny:Q4_K_M" in second.log
    finally:
        second.process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await second.process.wait() == 0


async def test_a_model_huggingface_hub_downloaded_loads_through_troupe(
    engine_path: Path, env: dict[str, str], hub: Hub, tmp_path: Path
) -> None:
    await trio.to_thread.run_sync(
        lambda: huggingface_hub.snapshot_download(
            "org/tiny",
            cache_dir=tmp_path / "cache",
            endpoint=hub.url.rstrip("/"),
            allow_patterns=[MODEL],
        )
    )
    async with router_for(engine_path, env, tmp_path) as router, router.client() as http:
        ids = [m["id"] for m in (await http.get("/models")).json()["data"]]
        assert ids == [NAME]
        assert (await complete(router, NAME)).strip()
