"""troupe in front of the real llama-server with tiny models, end to end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from troupe.sched import Status
from troupe_rig.events import collect_until
from troupe_rig.process import start_troupe
from troupe_rig.router import RunningRouter, open_router

pytestmark = pytest.mark.engine

CHILD_ARGS = ("--ctx-size", "256", "--parallel", "1")


@asynccontextmanager
async def real_router(
    engine: Path, models: Path, tmp_path: Path, *args: str
) -> AsyncIterator[RunningRouter]:
    async with open_router(
        ["--models-dir", str(models), *CHILD_ARGS, *args],
        engine=engine,
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    ) as router:
        yield router


async def test_load_unload_and_a_sigkilled_child(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with real_router(engine_path, tiny_model_dir, tmp_path) as router:
        sched = router.ctx.scheduler
        await sched.load("tiny-a")
        snap = await router.wait_for_status("tiny-a", Status.LOADED)
        assert snap.models["tiny-a"].loaded_info is not None  # the child's ready payload
        await sched.unload("tiny-a")
        snap = await router.wait_for_status("tiny-a", Status.UNLOADED)
        assert snap.models["tiny-a"].exit_code == 0
        assert not snap.models["tiny-a"].failed

        await sched.load("tiny-a")
        snap = await router.wait_for_status("tiny-a", Status.LOADED)
        os.kill(snap.models["tiny-a"].pid, signal.SIGKILL)
        snap = await router.wait_for_status("tiny-a", Status.UNLOADED)
        assert snap.models["tiny-a"].failed
        assert snap.models["tiny-a"].exit_code == 1
        await sched.load("tiny-a")
        await router.wait_for_status("tiny-a", Status.LOADED)


async def test_http_through_troupe(engine_path: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    async with (
        real_router(engine_path, tiny_model_dir, tmp_path) as router,
        router.client() as http,
    ):
        with router.ctx.scheduler.subscribe() as events:
            # Streaming chat completion, loading the model on demand.
            body = {
                "model": "tiny-a",
                "stream": True,
                "max_tokens": 6,
                "messages": [{"role": "user", "content": "hello"}],
            }
            chunks = []
            async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
            assert chunks[-1] == "[DONE]"
            assert any(json.loads(c)["choices"][0]["delta"].get("content") for c in chunks[:-1])

            resp = await http.post(
                "/completion", json={"model": "tiny-a", "prompt": "hello", "n_predict": 4}
            )
            assert resp.status_code == 200
            assert resp.json()["tokens_predicted"] == 4
            resp = await http.post("/tokenize", json={"model": "tiny-a", "content": "hello world"})
            assert resp.json()["tokens"]
            resp = await http.get("/props", params={"model": "tiny-a"})
            assert resp.status_code == 200
            assert "default_generation_settings" in resp.json()

            listed = {m["id"]: m for m in (await http.get("/models")).json()["data"]}
            assert listed["tiny-a"]["status"]["value"] == "loaded"
            assert listed["tiny-a"]["meta"]["n_ctx_train"] == 512
            assert listed["tiny-b"]["status"]["value"] == "unloaded"

            assert (await http.post("/models/unload", json={"model": "tiny-a"})).json() == {
                "success": True
            }
            await router.wait_for_status("tiny-a", Status.UNLOADED)
            listed = {m["id"]: m for m in (await http.get("/models")).json()["data"]}
            assert listed["tiny-a"]["status"]["value"] == "unloaded"

            with trio.fail_after(30):
                got = await collect_until(
                    events, lambda e: (e.get("data") or {}).get("status") == "unloaded"
                )
            seen = [(e["event"], (e.get("data") or {}).get("status")) for e in got]
            assert seen[0] == ("model_status", "loading")
            assert ("status_change", "loaded") in seen


async def test_client_disconnect_frees_the_real_child(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        real_router(engine_path, tiny_model_dir, tmp_path) as router,
        router.client() as http,
    ):
        body = {"model": "tiny-b", "stream": True, "n_predict": 100000, "prompt": "hello"}
        async with http.stream("POST", "/completion", json=body) as resp:
            async with contextlib.aclosing(resp.aiter_lines()) as lines:
                async for line in lines:
                    if line.startswith("data: "):
                        break
            assert router.snapshot.models["tiny-b"].in_flight == 1
        with trio.fail_after(30):  # the disconnect is seen at once; a loaded machine is slow
            await router.ctx.scheduler.wait_until(lambda s: s.models["tiny-b"].in_flight == 0)
        # The child stopped generating: its only slot is free again for the next request.
        resp = await http.post(
            "/completion", json={"model": "tiny-b", "prompt": "x", "n_predict": 2}
        )
        assert resp.status_code == 200


def _children_of(pid: int) -> list[psutil.Process]:
    try:
        return [
            p for p in psutil.Process(pid).children(recursive=True) if "llama-server" in p.name()
        ]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
async def test_troupe_process_leaves_no_child(
    how: str, engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    troupe = await start_troupe(
        [
            "--engine",
            str(engine_path),
            "--models-dir",
            str(tiny_model_dir),
            "--models-max",
            "0",
            *CHILD_ARGS,
        ],
        state_dir=tmp_path / "state",
    )
    proc = troupe.process
    async with trio.open_nursery() as nursery:
        nursery.start_soon(troupe.drain_log)
        async with httpx.AsyncClient(base_url=troupe.url, timeout=60) as http:
            for name in ("tiny-a", "tiny-b", "tiny-c"):
                resp = await http.post(
                    "/completion", json={"model": name, "prompt": "x", "n_predict": 1}
                )
                assert resp.status_code == 200
        children = _children_of(proc.pid)
        assert len(children) == 3
        proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
        with trio.fail_after(30):
            code = await proc.wait()
        if how == "SIGTERM":
            assert code == 0
        else:
            assert code == -signal.SIGKILL
        # SIGKILL: the children see stdin EOF and exit on their own.
        _gone, alive = await trio.to_thread.run_sync(
            lambda: psutil.wait_procs(children, timeout=30)
        )
        assert not alive, [p.pid for p in alive]
        nursery.cancel_scope.cancel()
