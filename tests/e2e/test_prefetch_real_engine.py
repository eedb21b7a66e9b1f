"""A model that waits for its slot has its file read into memory meanwhile:
the real engine, the real kernel's page cache, seen with ``mincore``."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.pagecache import drop_pages, resident_fraction, wait_resident
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine


async def test_the_next_model_is_read_ahead_while_its_victim_is_busy(
    engine_path: Path, tmp_path: Path
) -> None:
    models = [TinyModel(name=n, seed=i, n_ctx=256) for i, n in enumerate(("m-a", "m-b"))]
    _, file_b = write_tiny_models(tmp_path / "models", models)
    args = ["--models-dir", str(tmp_path / "models"), "--models-max", "1", "-c", "256"]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "s", cwd=tmp_path) as router,
        router.client() as http,
    ):
        scheduler = router.ctx.scheduler
        assert (await http.post("/completion", json={"model": "m-a", "prompt": "x"})).is_success
        rid, _ = await scheduler.acquire("m-a")  # a request in flight keeps m-a's slot
        drop_pages(file_b)
        if resident_fraction(file_b) > 0.1:
            pytest.skip(f"{tmp_path} keeps its pages in memory (tmpfs?)")
        answers: list[int] = []

        async def ask_b() -> None:
            resp = await http.post("/completion", json={"model": "m-b", "prompt": "x"})
            answers.append(resp.status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_b)
            with trio.fail_after(30):
                await scheduler.wait_until(lambda s: s.models["m-b"].waiting >= 1)
            assert await trio.to_thread.run_sync(wait_resident, file_b, 60.0) == 1.0
            assert scheduler.snapshot.models["m-b"].status.value == "unloaded"  # still waits
            await scheduler.release(rid)
        assert answers == [200]
