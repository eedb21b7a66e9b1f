"""``troupe models --url URL`` alone: the router there is the catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from troupe.commands.models import run_models
from troupe.sched import Status
from troupe_rig import write_tiny_models
from troupe_rig.router import open_router


async def test_url_alone_lists_the_routers_models(
    engine_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    write_tiny_models(models, ["m-one", "m-two"])
    size = (models / "m-one.gguf").stat().st_size
    args = ["--models-dir", str(models)]
    async with open_router(args, engine=engine_path, state_dir=tmp_path / "s") as router:
        await router.ctx.scheduler.load("m-one")
        await router.wait_for_status("m-one", Status.LOADED)
        code = await trio.to_thread.run_sync(run_models, ["--url", router.url])
        assert code == 0
        table = capsys.readouterr().out.splitlines()
        code = await trio.to_thread.run_sync(run_models, ["--url", router.url, "--json"])
        assert code == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert [line.split()[0] for line in table] == ["NAME", "m-one", "m-two"]
    assert table[1].split()[-1] == "loaded"
    assert rows["m-one"]["status"] == "loaded"
    assert rows["m-two"]["status"] == "unloaded"
    assert rows["m-one"]["context"] == 512
    # The size on disk, the figure troupe doctor shows too.
    assert rows["m-one"]["size_bytes"] == size
    assert rows["m-one"]["need_source"] in ("engine", "estimate")


async def test_without_url_it_asks_the_default_router_as_ps_does(
    engine_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No catalog flags and no --url: the router at $TROUPE_URL (else 127.0.0.1:8080), as
    `troupe ps`; a URL typed without its scheme (host:port) is http://host:port."""
    models = tmp_path / "models"
    write_tiny_models(models, ["m-one"])
    async with open_router(
        ["--models-dir", str(models)], engine=engine_path, state_dir=tmp_path / "s"
    ) as router:
        bare = router.url.removeprefix("http://")
        monkeypatch.setenv("TROUPE_URL", bare)
        code = await trio.to_thread.run_sync(run_models, ["--json"])
        assert code == 0
        assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["m-one"]
        monkeypatch.delenv("TROUPE_URL")
        code = await trio.to_thread.run_sync(run_models, ["--url", bare, "--json"])
        assert code == 0
        assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["m-one"]
