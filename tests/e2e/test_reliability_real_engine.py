"""troupe never wedges, against the real llama-server with faults from outside.

Each test is one defect the issue measured: it hung (or took the whole stop-timeout)
before the fix. Waits are on scheduler events; the `fail_after` bounds only turn a
hang into a failure.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from troupe.sched import Snapshot, Status
from troupe.service import shutdown
from troupe_rig.events import drain
from troupe_rig.hfcache import COMMIT
from troupe_rig.hfcache import write_hf_cache as hf_cache
from troupe_rig.router import RunningRouter, open_router

pytestmark = pytest.mark.engine

CHILD_ARGS = ("-c", "256", "-np", "1")


def preset(path: Path, sections: dict[str, dict[str, str]]) -> Path:
    lines = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {v}" for k, v in keys.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


@asynccontextmanager
async def router_for(
    engine: Path, tmp_path: Path, ini: Path, *args: str
) -> AsyncIterator[RunningRouter]:
    async with open_router(
        ["--models-preset", str(ini), *CHILD_ARGS, *args],
        engine=engine,
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    ) as router:
        yield router


async def complete(http: httpx.AsyncClient, model: str) -> httpx.Response:
    return await http.post("/completion", json={"model": model, "prompt": "hi", "n_predict": 2})


async def test_unload_right_after_ready_never_waits_for_the_stop_timeout(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # An exit command that lands just before llama-server's main loop starts is lost,
    # and its stdin watcher reads only one: the old ladder waited the whole stop-timeout.
    ini = preset(
        tmp_path / "p.ini",
        {"a": {"model": str(tiny_model_dir / "tiny-a.gguf"), "stop-timeout": "60"}},
    )
    async with router_for(engine_path, tmp_path, ini) as router:
        for _ in range(20):
            await router.ctx.scheduler.load("a")
            await router.wait_for_status("a", Status.LOADED)
            await router.ctx.scheduler.unload("a")
            with trio.fail_after(30):  # far below the 60 s stop-timeout
                snap = await router.wait_for_status("a", Status.UNLOADED)
            assert not snap.models["a"].failed, snap.models["a"].last_error


async def test_an_abandoned_reload_leaves_cold_loads_working(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The reload waits for a changed model that is slow to stop (SIGSTOPped from outside,
    # so it ignores the exit command and SIGTERM); the client gives up after 1 s. The
    # reload must still finish, and a request for a model not loaded must be served.
    models = {"model": str(tiny_model_dir / "tiny-a.gguf"), "stop-timeout": "1", "term-grace": "1"}
    ini = preset(
        tmp_path / "p.ini", {"a": models, "b": {"model": str(tiny_model_dir / "tiny-b.gguf")}}
    )
    async with router_for(engine_path, tmp_path, ini) as router, router.client() as http:
        assert (await complete(http, "a")).status_code == 200
        pid = router.snapshot.models["a"].pid
        os.kill(pid, signal.SIGSTOP)
        preset(
            tmp_path / "p.ini",
            {"a": {**models, "temp": "0.5"}, "b": {"model": str(tiny_model_dir / "tiny-b.gguf")}},
        )
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/models", params={"reload": "1"}, timeout=1.0)
        with trio.fail_after(30):
            resp = await complete(http, "b")
        assert resp.status_code == 200, resp.text
        listed = {m["id"]: m for m in (await http.get("/models")).json()["data"]}
        assert "temperature = 0.5" in listed["a"]["status"]["preset"]  # the reload took effect
        # Its stopped child is killed after stop-timeout and term-grace (2 s): b's load may
        # have been quicker, so the unload is waited for (an event), not read at once.
        await router.wait_for_status("a", Status.UNLOADED, within=60)
        assert (await complete(http, "a")).status_code == 200  # with its new preset


async def test_a_hung_load_blocks_no_other_model_and_times_out(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The child of "hung" blocks in its load (its model is a FIFO nobody writes) and is
    # SIGSTOPped on top. Another model must load beside it, and the hung load must end
    # in a clear error after --load-timeout (10 s: b's cold load on a loaded machine
    # must end well before it, or "hung" would fail first).
    fifo = tmp_path / "hung.gguf"
    os.mkfifo(fifo)
    ini = preset(
        tmp_path / "p.ini",
        {"hung": {"model": str(fifo)}, "b": {"model": str(tiny_model_dir / "tiny-b.gguf")}},
    )
    async with (
        router_for(
            engine_path, tmp_path, ini, "--models-max", "2", "--load-timeout", "10"
        ) as router,
        router.client() as http,
        trio.open_nursery() as nursery,
    ):
        hung: list[httpx.Response] = []

        async def ask_hung() -> None:
            hung.append(await complete(http, "hung"))

        nursery.start_soon(ask_hung)
        sched = router.ctx.scheduler
        snap = await sched.wait_until(lambda s: s.models["hung"].pid != 0)
        os.kill(snap.models["hung"].pid, signal.SIGSTOP)
        as_b_loaded: list[Snapshot] = []  # the state as b loaded, not as read afterwards

        async def watch_b() -> None:
            b_loaded = await sched.wait_until(lambda s: s.models["b"].status is Status.LOADED)
            as_b_loaded.append(b_loaded)

        nursery.start_soon(watch_b)
        with trio.fail_after(30):
            resp = await complete(http, "b")
        assert resp.status_code == 200, resp.text
        assert as_b_loaded[0].models["hung"].status is Status.LOADING  # still hung meanwhile
        with trio.fail_after(30):
            snap = await router.ctx.scheduler.wait_until(lambda s: s.models["hung"].failed)
        assert "load timed out" in (snap.models["hung"].last_error or "")
    assert hung[0].status_code == 500
    assert "load timed out: no progress for 10 s" in hung[0].json()["error"]["message"]


async def test_an_abandoned_delete_still_removes_the_model_and_leaves_loads_working(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # DELETE /models waits for the model's child, which is SIGSTOPped (slow to stop);
    # the client gives up. The scheduler still stops it, deletes the files, reloads and
    # announces the removal; other models load meanwhile and afterwards.
    cache = tmp_path / "hub"
    repo = hf_cache(cache)
    env = {**os.environ, "LLAMA_CACHE": str(cache)}
    ini = preset(
        tmp_path / "p.ini",
        {
            "*": {"stop-timeout": "1", "term-grace": "1"},
            "local": {"model": str(tiny_model_dir / "tiny-a.gguf")},
        },
    )
    args = ["--models-preset", str(ini), "--offline", *CHILD_ARGS]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "s", environ=env) as router,
        router.client() as http,
    ):
        name = "org/repo:Q8_0"
        assert (await complete(http, name)).status_code == 200
        os.kill(router.snapshot.models[name].pid, signal.SIGSTOP)
        with router.ctx.scheduler.subscribe() as events:
            with pytest.raises(httpx.ReadTimeout):
                await http.delete("/models", params={"model": name}, timeout=1.0)
            with trio.fail_after(30):
                assert (await complete(http, "local")).status_code == 200
                async for event in events:
                    if event == {"model": name, "event": "model_remove"}:
                        break
        assert not (repo / "snapshots" / COMMIT / "model-Q8_0.gguf").exists()
        names = [m["id"] for m in (await http.get("/models")).json()["data"]]
        assert names == ["local", "org/repo:Q4_K_M"]
        resp = await complete(http, name)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == f"model '{name}' not found"
        assert (await complete(http, "org/repo:Q4_K_M")).status_code == 200


async def test_a_failed_memory_reading_does_not_hold_loads_forever(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ini = preset(tmp_path / "p.ini", {"a": {"model": str(tiny_model_dir / "tiny-a.gguf")}})
    async with (
        router_for(engine_path, tmp_path, ini, "--models-memory-margin", "0") as router,
        router.client() as http,
    ):
        sampler = router.ctx.scheduler.sampler
        assert sampler is not None
        assert router.snapshot.models["a"].memory_need  # the estimate is known: it is checked

        def broken(pids: object) -> None:
            raise OSError("cannot read /proc/meminfo")

        monkeypatch.setattr(sampler, "sample", broken)
        with router.ctx.scheduler.subscribe() as events, trio.fail_after(30):
            resp = await complete(http, "a")
            assert resp.status_code == 200, resp.text
            warnings = [
                e for e in drain(events) if e["event"] == "troupe_memory" and "warning" in e["data"]
            ]
        assert "memory could not be read" in warnings[0]["data"]["warning"]


async def test_shutdown_drains_requests_in_flight_and_answers_the_waiting(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # LLAMA_SERVER_DEBUG_FAKE_TIMING holds a proxied request 2 s in flight (upstream's debug hook):
    # the shutdown must let it finish, answer the request queued for another model at
    # once, start no load, and then stop every child.
    ini = preset(
        tmp_path / "p.ini",
        {
            "a": {"model": str(tiny_model_dir / "tiny-a.gguf")},
            "b": {"model": str(tiny_model_dir / "tiny-b.gguf")},
        },
    )
    env = {**os.environ, "LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}
    args = ["--models-preset", str(ini), *CHILD_ARGS, "--models-max", "1"]
    results: dict[str, httpx.Response] = {}
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "s", environ=env) as router,
        router.client() as http,
    ):
        await router.ctx.scheduler.load("a")
        await router.wait_for_status("a", Status.LOADED)

        async def ask(model: str) -> None:
            results[model] = await http.post(
                "/completion",
                json={"model": model, "prompt": "hi", "n_predict": 8, "stream": True},
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a")
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 1)
            nursery.start_soon(ask, "b")
            await router.ctx.scheduler.wait_until(lambda s: s.models["b"].waiting == 1)
            pid = router.snapshot.models["a"].pid
            with trio.fail_after(30):
                await shutdown(router.ctx)
        assert results["b"].status_code == 503
        assert results["b"].json()["error"]["message"] == "server is shutting down"
        assert results["a"].status_code == 200
        assert '"stop":true' in results["a"].text, results["a"].text  # the whole stream
        assert router.snapshot.models["b"].status is Status.UNLOADED  # never started
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
