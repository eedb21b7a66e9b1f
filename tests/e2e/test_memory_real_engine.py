"""Memory admission on this machine's real host RAM, with the real engine.

The models are tiny GGUFs made large enough to matter (about 300 MiB each in use).
The margin is set from a fresh reading so that two models fit and a third does not,
with half a model of slack either way, so memory other programs use while the test
runs does not decide the outcome.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from troupe.catalog.memory import model_need
from troupe.child.breakdown import parse_buffer_line
from troupe.sched import Status
from troupe_rig import TinyModel, open_engine, write_tiny_gguf
from troupe_rig.router import RunningRouter, open_router

pytestmark = pytest.mark.engine

BIG = TinyModel(name="big", n_layer=32, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_ctx=1024)


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("big") / "big.gguf", BIG)


@asynccontextmanager
async def router_for(
    engine: Path, model: Path, tmp_path: Path, fake_timing: bool = False
) -> AsyncIterator[RunningRouter]:
    preset = tmp_path / "three.ini"
    preset.write_text(
        "[*]\nctx-size = 512\nparallel = 1\n"
        + "".join(f"[m{i}]\nmodel = {model}\n" for i in (1, 2, 3))
    )
    env = dict(os.environ)
    if fake_timing:
        env["LLAMA_SERVER_DEBUG_FAKE_TIMING"] = "1"
    async with open_router(
        ["--models-preset", str(preset), "--models-max", "0", "--models-memory-margin", "0"],
        engine=engine,
        state_dir=tmp_path / "state",
        cwd=tmp_path,
        environ=env,
    ) as router:
        yield router


async def squeeze_so_that_two_fit(router: RunningRouter, newcomer: str) -> None:
    """Set the margin so that ``newcomer`` lacks half its need; one eviction makes room."""
    sched = router.ctx.scheduler
    ledger, sampler = sched.ledger, sched.sampler
    assert ledger is not None
    assert sampler is not None
    holders = {n: v.pid for n, v in router.snapshot.models.items() if v.status is Status.LOADED}
    sample = await sampler.asample(holders.values())
    available = ledger.available(sample, holders)["host"]
    need = (ledger.need(newcomer) or {})["host"]
    ledger.margin = available - need + need // 2


async def complete(http: httpx.AsyncClient, model: str, results: list[tuple[str, int]]) -> None:
    resp = await http.post("/completion", json={"model": model, "prompt": "hi", "n_predict": 1})
    results.append((model, resp.status_code))


async def test_two_fit_and_the_third_evicts_the_least_recently_used(
    engine_path: Path, big_model: Path, tmp_path: Path
) -> None:
    async with router_for(engine_path, big_model, tmp_path) as router, router.client() as http:
        results: list[tuple[str, int]] = []
        await complete(http, "m1", results)
        await complete(http, "m2", results)
        ledger = router.ctx.scheduler.ledger
        assert ledger is not None
        await router.ctx.scheduler.wait_until(lambda s: "m2" in ledger.effective)  # true-up seen
        await squeeze_so_that_two_fit(router, "m3")
        await complete(http, "m3", results)
        assert results == [("m1", 200), ("m2", 200), ("m3", 200)]
        snap = router.snapshot
        assert snap.models["m1"].status is Status.UNLOADED
        assert snap.models["m1"].last_eviction == "memory for m3"
        assert snap.models["m2"].status is Status.LOADED


async def test_a_busy_model_is_never_evicted_for_memory(
    engine_path: Path, big_model: Path, tmp_path: Path
) -> None:
    # Fake timing holds each request busy for 2 s: m1 is busy while m3 is admitted.
    async with (
        router_for(engine_path, big_model, tmp_path, fake_timing=True) as router,
        router.client() as http,
    ):
        results: list[tuple[str, int]] = []
        await complete(http, "m1", results)
        await complete(http, "m2", results)  # m1 is now the least recently used
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, http, "m1", results)
            await router.ctx.scheduler.wait_until(lambda s: s.models["m1"].in_flight == 1)
            await squeeze_so_that_two_fit(router, "m3")
            await complete(http, "m3", results)
        assert sorted(results) == [("m1", 200), ("m1", 200), ("m2", 200), ("m3", 200)]
        snap = router.snapshot
        assert snap.models["m1"].status is Status.LOADED
        assert snap.models["m2"].last_eviction == "memory for m3"


async def test_the_estimate_is_within_a_quarter_of_the_engines_own_breakdown(
    engine_path: Path, big_model: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from troupe.catalog import build_catalog  # noqa: PLC0415
    from troupe.catalog.facts import FactsCache  # noqa: PLC0415
    from troupe.settings.argv import parse_engine_args  # noqa: PLC0415
    from troupe.settings.options import load_option_table  # noqa: PLC0415
    from troupe.settings.router import build_settings, with_router_options  # noqa: PLC0415

    for model in (big_model, tiny_model_dir / "tiny-a.gguf"):
        args = ["-c", "512", "-np", "1"]
        reported: dict[str, int] = {}
        async with open_engine(
            [str(engine_path), "-m", str(model), "--port", "0", "-lv", "4", *args], child=False
        ) as proc:
            await proc.wait_log(r"compute buffer size")
            for line in proc.stderr_lines:
                parsed = parse_buffer_line(line)
                if parsed is not None:
                    reported[parsed.kind] = reported.get(parsed.kind, 0) + parsed.bytes
        table = with_router_options(load_option_table(engine_path))
        settings = build_settings(
            table, parse_engine_args(["--models-dir", str(model.parent), *args], table), {}, {}
        )
        catalog = build_catalog(settings, table, {}, tmp_path)
        entry = catalog.get(model.stem)
        assert entry is not None
        need = model_need(entry, FactsCache())
        assert need is not None
        truth = sum(reported.values())
        assert abs(need["host"] - truth) / truth < 0.25, (model.name, need, reported)
