"""``troupe ps``: the loaded models of a running router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from troupe.commands.ps import run_ps
from troupe.errors import TroupeError
from troupe.sched import Status
from troupe_rig import write_tiny_models
from troupe_rig.router import open_router


async def test_ps_lists_loaded_models(
    engine_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    write_tiny_models(models, ["m-one", "m-two"])
    async with (
        open_router(
            ["--models-dir", str(models)], engine=engine_path, state_dir=tmp_path / "s"
        ) as router,
        router.client() as http,
    ):
        body = {"model": "m-one", "prompt": "hi", "n_predict": 2}
        assert (await http.post("/completion", json=body)).status_code == 200
        await router.wait_for_status("m-one", Status.LOADED)
        view = router.snapshot.models["m-one"]
        assert await trio.to_thread.run_sync(run_ps, ["--url", router.url]) == 0
        table = capsys.readouterr().out.splitlines()
        assert await trio.to_thread.run_sync(run_ps, ["--url", router.url, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
    assert table[0].split()[:4] == ["NAME", "STATUS", "PORT", "PID"]
    assert [line.split()[0] for line in table[1:]] == ["m-one"]  # m-two is not loaded
    (row,) = rows
    assert (row["name"], row["status"], row["port"], row["pid"]) == (
        "m-one", "loaded", view.port, view.pid,
    )  # fmt: skip
    assert row["memory_bytes"] > 0
    assert row["memory_source"] in ("observed", "engine", "estimate")
    assert row["up_seconds"] is not None
    assert row["idle_seconds"] is not None
    assert row["in_flight"] == 0


def test_ps_with_nothing_there() -> None:
    with pytest.raises(TroupeError, match=r"no router answered at http://127\.0\.0\.1:9"):
        run_ps(["--url", "http://127.0.0.1:9"])
