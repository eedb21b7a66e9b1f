"""``troupe models``: the catalog as a table, with status from a running router."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from troupe.commands.models import run_models
from troupe.sched import Status
from troupe_rig import write_tiny_models
from troupe_rig.router import open_router


async def test_table_with_live_status(
    engine_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    write_tiny_models(models, ["m-one", "m-two"])
    args = ["--engine", str(engine_path), "--models-dir", str(models)]
    async with open_router(args[2:], engine=engine_path, state_dir=tmp_path / "s") as router:
        await router.ctx.scheduler.load("m-one")
        await router.wait_for_status("m-one", Status.LOADED)
        code = await trio.to_thread.run_sync(run_models, [*args, "--url", router.url])
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "NAME", "SOURCE", "SIZE", "CONTEXT", "NEED", "CAPABILITIES", "FIT", "STATUS"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert rows["m-one"][1] == "models_dir"
    assert rows["m-one"][-1] == "loaded"
    assert rows["m-two"][-1] == "unloaded"
    assert rows["m-one"][4] == "512"  # the tiny model's trained context
    # The router's need, with its source (SIZE and NEED are "N MiB": two words each).
    assert rows["m-one"][7] in ("(engine)", "(estimate)")
    assert rows["m-one"][-2] == "GREEN"  # a few MiB fit anywhere


def test_without_a_router_status_is_unknown(
    engine_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tiny_models(tmp_path, ["solo"])
    code = run_models(
        ["--engine", str(engine_path), "--models-dir", str(tmp_path), "--url", "http://127.0.0.1:9"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "solo" in out
    assert "status unknown" in out
