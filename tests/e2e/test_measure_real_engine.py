"""The measurement job against the real engine: its own projection, with the child's
exact arguments, agrees with what the child reports once loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from troupe.actors.measure import MeasureJob
from troupe.messages import Measured, MeasureFailed, Message
from troupe_rig import TinyModel, write_tiny_gguf
from troupe_rig.checks import loaded_breakdown
from troupe_rig.router import open_router, write_preset

pytestmark = pytest.mark.engine

SHAPE = TinyModel(name="mid", n_layer=16, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_ctx=2048)


async def measure(argv: list[str]) -> Message:
    send, recv = trio.open_memory_channel[Message](1)
    await MeasureJob("m", "fp", argv, {}, send).run()
    return await recv.receive()


@pytest.mark.parametrize("ctx", ["512", "2048"])
async def test_the_projection_matches_the_childs_own_breakdown_after_load(
    engine_path: Path, tmp_path: Path, ctx: str
) -> None:
    model = write_tiny_gguf(tmp_path / "mid.gguf", SHAPE)
    argv = [str(engine_path), "-m", str(model), "--port", "0", "-c", ctx, "-np", "2"]
    result = await measure(argv)
    assert isinstance(result, Measured), result
    after, _ = await loaded_breakdown(argv)
    projected, real = result.need["host"], after["host"]
    assert abs(projected - real) <= 0.1 * real, (projected, real)


async def test_fit_off_leaves_the_estimate_and_says_why(engine_path: Path, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "mid.gguf", SHAPE)
    result = await measure([str(engine_path), "-m", str(model), "--port", "0", "--fit", "off"])
    assert isinstance(result, MeasureFailed)
    assert "fit" in result.reason


async def test_models_shows_the_engines_figure_and_its_source(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    sections = {
        "measured": {"model": str(tiny_model_dir / "tiny-a.gguf")},
        "unmeasured": {"model": str(tiny_model_dir / "tiny-b.gguf"), "fit": "off"},
    }
    preset = write_preset(tmp_path, sections)
    async with (
        open_router(
            ["--models-preset", str(preset), "-c", "256"],
            engine=engine_path,
            state_dir=tmp_path / "state",
            cwd=tmp_path,
        ) as router,
        router.client() as http,
    ):
        for name in sections:
            resp = await http.post("/completion", json={"model": name, "prompt": "hi"})
            assert resp.status_code == 200
        ledger = router.ctx.scheduler.ledger
        assert ledger is not None
        with trio.fail_after(30):  # measured before they loaded, once each
            await router.ctx.scheduler.wait_until(
                lambda s: all(v.memory_source is not None for v in s.models.values())
            )
            # ... and read once up (the true-up comes a moment after ready)
            await router.ctx.scheduler.wait_until(lambda s: set(sections) <= set(ledger.effective))
        listed = {
            m["id"]: m["troupe"]["memory"] for m in (await http.get("/models")).json()["data"]
        }
    assert listed["measured"]["source"] == "engine"
    assert listed["unmeasured"]["source"] == "estimate"
    for memory in listed.values():
        assert memory["need_bytes"]["host"] > 0
        assert memory["used_bytes"]["host"] > 0  # observed once up


async def test_every_model_is_projected_at_startup_before_any_request(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A model's first load then need not wait for its own projection.
    async with (
        open_router(
            ["--models-dir", str(tiny_model_dir), "-c", "256"],
            engine=engine_path,
            state_dir=tmp_path / "state",
            cwd=tmp_path,
        ) as router,
        router.client() as http,
    ):
        with trio.fail_after(60):
            await router.ctx.scheduler.wait_until(
                lambda s: all(v.memory_source == "engine" for v in s.models.values())
            )
        assert router.ctx.scheduler.snapshot.running == 0  # projected, none loaded
        listed = (await http.get("/models")).json()["data"]
    assert {m["troupe"]["memory"]["source"] for m in listed} == {"engine"}
