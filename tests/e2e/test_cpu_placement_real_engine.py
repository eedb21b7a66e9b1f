"""CPU placement with the real engine, read where the kernel keeps it: each child's
``Cpus_allowed_list`` for every one of its threads (``/proc/PID/task/*/status``) and
the thread count it was started with (its command line)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from troupe.hardware.cpus import parse_cpu_list
from troupe.sched import Status
from troupe_rig.router import RunningRouter, open_router

pytestmark = pytest.mark.engine

ALLOWED = sorted(os.sched_getaffinity(0))


def task_cpus(pid: int) -> list[set[int]]:
    """The CPU set of each thread of ``pid``."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.append(set(parse_cpu_list(line.split(":", 1)[1])))
    return out


def argv_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def child_pid(router: RunningRouter, model: str) -> int:
    pid = router.snapshot.models[model].pid
    assert pid, model
    return pid


async def complete(router: RunningRouter, model: str) -> None:
    async with router.client() as http:
        body = {"model": model, "prompt": "hello", "n_predict": 4}
        resp = await http.post("/completion", json=body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["content"] is not None


def args(tiny_model_dir: Path, *extra: str) -> list[str]:
    return ["--models-dir", str(tiny_model_dir), "-c", "256", "--models-max", "2", *extra]


async def test_a_model_alone_runs_on_every_core_though_others_are_in_the_catalog(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with open_router(
        args(tiny_model_dir), engine=engine_path, state_dir=tmp_path / "s", cwd=tmp_path
    ) as router:
        await complete(router, "tiny-a")
        pid = child_pid(router, "tiny-a")
        assert flag(argv_of(pid), "--threads") == str(len(ALLOWED))
        cpus = task_cpus(pid)  # with --cpu-strict, each compute thread has one CPU
        assert set().union(*cpus) == set(ALLOWED)
        assert all(c <= set(ALLOWED) for c in cpus)
        async with router.client() as http:
            cpu = {m["id"]: m for m in (await http.get("/models")).json()["data"]}["tiny-a"]
        assert cpu["troupe"]["cpu"]["threads"] == len(ALLOWED)


@pytest.mark.skipif(len(ALLOWED) < 2, reason="one CPU: every lane is shared")
async def test_children_beside_each_other_never_share_a_core_and_both_still_serve(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with open_router(
        args(tiny_model_dir), engine=engine_path, state_dir=tmp_path / "s", cwd=tmp_path
    ) as router:
        await complete(router, "tiny-a")
        first = router.snapshot.models["tiny-a"].pid
        await complete(router, "tiny-b")  # at once; tiny-a, all cores, is started again narrower
        with trio.fail_after(60):
            await router.ctx.scheduler.wait_until(
                lambda s: (
                    s.models["tiny-a"].status is Status.LOADED
                    and s.models["tiny-a"].pid not in (0, first)
                    and not s.models["tiny-a"].stopping
                )
            )
        lanes = {}
        for model in ("tiny-a", "tiny-b"):
            pid = child_pid(router, model)
            cpus = task_cpus(pid)
            lanes[model] = set().union(*cpus)
            assert flag(argv_of(pid), "--threads") == str(len(lanes[model]))
            assert flag(argv_of(pid), "--cpu-strict") == "1"
        assert lanes["tiny-a"].isdisjoint(lanes["tiny-b"]), lanes
        assert lanes["tiny-a"] | lanes["tiny-b"] <= set(ALLOWED)
        async with trio.open_nursery() as nursery:  # both serve, at the same time
            for model in ("tiny-a", "tiny-b"):
                nursery.start_soon(complete, router, model)


async def test_a_childs_own_threads_flag_is_kept_and_nothing_is_added(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with open_router(
        args(tiny_model_dir, "--threads", "1"),
        engine=engine_path,
        state_dir=tmp_path / "s",
        cwd=tmp_path,
    ) as router:
        await complete(router, "tiny-a")
        await complete(router, "tiny-b")
        for model in ("tiny-a", "tiny-b"):
            argv = argv_of(child_pid(router, model))
            assert argv.count("--threads") == 1
            assert flag(argv, "--threads") == "1"
            assert "--cpu-range" not in argv
            assert "--cpu-mask" not in argv


async def test_placement_off_leaves_the_engine_its_defaults(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with open_router(
        args(tiny_model_dir, "--cpu-placement", "off"),
        engine=engine_path,
        state_dir=tmp_path / "s",
        cwd=tmp_path,
    ) as router:
        await complete(router, "tiny-a")
        argv = argv_of(child_pid(router, "tiny-a"))
        for name in ("--threads", "--threads-batch", "--cpu-range", "--cpu-strict", "--poll"):
            assert name not in argv


async def load_until_loaded(router: RunningRouter, model: str) -> None:
    async with router.client() as http:
        resp = await http.post("/models/load", json={"model": model})
        assert resp.status_code == 200, resp.text
    with trio.fail_after(60):
        await router.ctx.scheduler.wait_until(lambda s: s.models[model].status is Status.LOADED)


async def api_statuses(router: RunningRouter) -> dict[str, str]:
    async with router.client() as http:
        resp = await http.get("/models")
    assert resp.status_code == 200, resp.text
    return {m["id"]: m["status"]["value"] for m in resp.json()["data"]}


@pytest.mark.skipif(len(ALLOWED) < 2, reason="one CPU: every lane is shared")
async def test_a_restart_on_a_narrower_lane_is_no_use_of_the_model(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # llama.cpp's test_router_models_max_evicts_lru, with the CPU placement on (default):
    # --models-max 2, load a, then b (a is started again on a narrower lane), then c.
    async with open_router(
        args(tiny_model_dir), engine=engine_path, state_dir=tmp_path / "s", cwd=tmp_path
    ) as router:
        await load_until_loaded(router, "tiny-a")
        first = child_pid(router, "tiny-a")
        await load_until_loaded(router, "tiny-b")
        # Resident all along, as upstream shows it, its restart or not.
        assert (await api_statuses(router))["tiny-a"] == "loaded"
        await load_until_loaded(router, "tiny-c")
        # The victim may still be exiting as tiny-c loads (the next child starts beside
        # it when memory allows): its unload is waited for, not read at once.
        await router.wait_for_status("tiny-a", Status.UNLOADED)
        assert router.snapshot.models["tiny-a"].last_eviction == "lru for tiny-c"
        statuses = await api_statuses(router)
        assert (statuses["tiny-a"], statuses["tiny-b"]) == ("unloaded", "loaded")
        assert router.snapshot.models["tiny-b"].status is Status.LOADED
        assert first not in (0, router.snapshot.models["tiny-a"].pid)  # it was restarted
