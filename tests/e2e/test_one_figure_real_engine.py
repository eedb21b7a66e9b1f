"""One figure for a model's context and memory need: for the same flags, ``troupe
doctor``, ``troupe models`` and ``GET /models`` show the same context and the same need
(the engine's projection with the child's own arguments; the dashboard shows /models',
tests/e2e/test_dashboard_browser.py). Gemma 3 (the demo model) has sliding-window
attention, so the KV store gives its child ``--swa-full``: a figure made without it
(doctor's 419 MiB against the router's 892 MiB at 32k) is not the router's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from troupe.commands.doctor import run_doctor
from troupe.commands.models import run_models
from troupe.demo import assemble_demo_model
from troupe.hardware.feasibility import format_bytes
from troupe.sched import Snapshot
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

GEMMA = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("gemma")
    assemble_demo_model(directory)
    return directory


@pytest.mark.parametrize(
    ("flags", "n_ctx"),
    [((), 32768), (("--ctx-size", "4096"), 4096)],
    ids=["trained-context", "ctx-size"],
)
async def test_doctor_models_and_the_router_show_one_context_and_need(
    engine_path: Path,
    gemma_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: tuple[str, ...],
    n_ctx: int,
) -> None:
    args = ["--models-dir", str(gemma_dir), *flags]

    def measured(snap: Snapshot) -> bool:
        view = snap.models.get(GEMMA)
        return view is not None and view.memory_source == "engine"

    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "s") as router,
        router.client() as http,
    ):
        with trio.fail_after(120):
            await router.ctx.scheduler.wait_until(measured)
        item = next(m for m in (await http.get("/models")).json()["data"] if m["id"] == GEMMA)
        code = await trio.to_thread.run_sync(
            run_models, [*args, "--engine", str(engine_path), "--url", router.url, "--json"]
        )
        assert code == 0
        (row,) = json.loads(capsys.readouterr().out)
    extra = item["troupe"]
    assert extra["memory"]["source"] == "engine"
    need = sum(extra["memory"]["need_bytes"].values())
    assert extra["context"]["n_ctx"] == n_ctx
    assert (row["context"], row["context_why"]) == (n_ctx, extra["context"]["why"])
    assert (row["need_bytes"], row["need_source"]) == (need, "engine")

    code = await trio.to_thread.run_sync(run_doctor, ["--engine", str(engine_path), *args])
    assert code == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"  {GEMMA} ")]
    assert f"  {n_ctx} ({extra['context']['why']})  " in line, line
    assert f"{format_bytes(need)} (engine: " in line, line
