"""POST /models and DELETE /models over an HF cache the test builds, as upstream."""

from __future__ import annotations

import os
from pathlib import Path

from troupe.sched import Status
from troupe_rig.events import drain
from troupe_rig.hfcache import COMMIT
from troupe_rig.hfcache import write_hf_cache as hf_cache
from troupe_rig.router import RouterFactory, open_router

FORMAT = "<user>/<model>[:quant]"


async def test_delete_stops_and_removes_a_cache_model_and_only_it(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    repo = hf_cache(cache)
    env = {**os.environ, "LLAMA_CACHE": str(cache)}
    preset = tmp_path / "local.ini"
    preset.write_text(f"[local]\nmodel = {tiny_model_dir / 'tiny-a.gguf'}\n")
    args = ["--models-preset", str(preset), "--offline", "--ctx-size", "256"]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "s", environ=env) as router,
        router.client() as http,
    ):
        names = [m["id"] for m in (await http.get("/models")).json()["data"]]
        assert names == ["local", "org/repo:Q4_K_M", "org/repo:Q8_0"]
        await http.post("/models/load", json={"model": "org/repo:Q8_0"})
        await router.wait_for_status("org/repo:Q8_0", Status.LOADED)
        for params, status, message in [
            ({}, 400, "model must be a non-empty string"),
            ({"model": "nope"}, 500, "model name=nope is not found"),
            ({"model": "local"}, 500, "model name=local is not removable (not from cache)"),
        ]:
            resp = await http.delete("/models", params=params)
            assert (resp.status_code, resp.json()["error"]["message"]) == (status, message)

        with router.ctx.scheduler.subscribe() as events:
            resp = await http.delete("/models", params={"model": "org/repo:Q8_0"})
            assert resp.json() == {"success": True}
            assert {"model": "org/repo:Q8_0", "event": "model_remove"} in drain(events)
        assert not (repo / "snapshots" / COMMIT / "model-Q8_0.gguf").exists()
        assert not (repo / "blobs" / "oid1").exists()  # no longer referenced
        assert (repo / "blobs" / "oid0").exists()  # the other tag keeps its file
        names = [m["id"] for m in (await http.get("/models")).json()["data"]]
        assert names == ["local", "org/repo:Q4_K_M"]
        assert "org/repo:Q8_0" not in router.snapshot.models


async def test_post_models_validates_like_upstream(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    hf_cache(cache)
    env = {**os.environ, "LLAMA_CACHE": str(cache)}
    async with fake_router({"local": {}}, environ=env) as router, router.client() as http:
        cases = [
            ({}, 400, "model must be a non-empty string"),
            (
                {"model": "t1"},
                400,
                "error: invalid HF repo format, expected <user>/<model>[:quant]\n",
            ),
            ({"model": "org/repo:Q8_0"}, 400, "model 'org/repo:Q8_0' already exists"),
        ]
        for body, status, message in cases:
            resp = await http.post("/models", json=body)
            assert (resp.status_code, resp.json()["error"]["message"]) == (status, message)
