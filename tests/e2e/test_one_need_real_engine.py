"""One memory need for one model: ``troupe doctor`` shows the engine's own
projection, the figure the router admits by and ``GET /models`` shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from troupe.commands.doctor import run_doctor
from troupe.hardware.feasibility import format_bytes
from troupe.sched import Snapshot
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine


async def test_doctor_and_models_agree(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--models-dir", str(tiny_model_dir), "--ctx-size", "256"]

    def measured(snap: Snapshot) -> bool:
        view = snap.models.get("tiny-a")
        return view is not None and view.memory_source == "engine"

    async with (
        open_router(flags, engine=engine_path, state_dir=tmp_path / "s") as router,
        router.client() as http,
    ):
        with trio.fail_after(60):
            await router.ctx.scheduler.wait_until(measured)
        item = next(m for m in (await http.get("/models")).json()["data"] if m["id"] == "tiny-a")
    memory = item["troupe"]["memory"]
    assert memory["source"] == "engine"
    need = sum(memory["need_bytes"].values())
    assert await trio.to_thread.run_sync(run_doctor, ["--engine", str(engine_path), *flags]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  tiny-a ")]
    assert f"{format_bytes(need)} (engine: " in line
