"""GET /models?reload=: re-scan, restart what changed, keep what did not (as upstream)."""

from __future__ import annotations

from pathlib import Path

from troupe.sched import Status
from troupe_rig.router import RouterFactory, write_preset


async def test_reload_restarts_changed_models_only(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    async with fake_router({"a": {}, "b": {}, "gone": {}}) as router, router.client() as http:
        with router.ctx.scheduler.subscribe() as events:
            for name in ("a", "b", "gone"):
                await http.post("/models/load", json={"model": name})
                await router.wait_for_status(name, Status.LOADED)
            pid_b = router.snapshot.models["b"].pid
            write_preset(tmp_path, {"a": {"ctx-size": "128"}, "b": {}, "c": {}})
            listed = (await http.get("/models", params={"reload": "1"})).json()["data"]
            by_id = {m["id"]: m for m in listed}
            assert sorted(by_id) == ["a", "b", "c"]
            assert by_id["a"]["status"]["value"] == "unloaded"  # restarted: stopped, not reloaded
            assert "ctx-size = 128" in by_id["a"]["status"]["preset"]
            assert by_id["b"]["status"]["value"] == "loaded"
            assert router.snapshot.models["b"].pid == pid_b
            assert by_id["c"]["status"]["value"] == "unloaded"
            await router.ctx.scheduler.wait_until(lambda s: "gone" not in s.models)
            names = []
            async for event in events:
                names.append(event["event"])
                if event["event"] == "models_reload":
                    assert event == {"model": "*", "event": "models_reload"}
                    break
        # The new preset is in force: a starts with it.
        resp = await http.post("/completion", json={"model": "a", "prompt": "x", "n_predict": 1})
        assert resp.status_code == 200
        assert "--ctx-size" in router.ctx.status_args(router.ctx.catalog.resolve("a"))  # type: ignore[arg-type]


async def test_broken_preset_on_reload_is_a_500_and_keeps_the_old_catalog(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        (tmp_path / "preset.ini").write_text("[a]\nmodel = a.gguf\nnot-an-option = 1\n")
        resp = await http.get("/models", params={"reload": "1"})
        assert resp.status_code == 500
        assert resp.json()["error"]["type"] == "server_error"
        assert "not recognized" in resp.json()["error"]["message"]
        assert (
            await http.post("/completion", json={"model": "a", "prompt": "x"})
        ).status_code == 200


async def test_load_on_startup_starts_after_listening(fake_router: RouterFactory) -> None:
    async with fake_router({"early": {"load-on-startup": "true"}, "late": {}}) as router:
        await router.wait_for_status("early", Status.LOADED)
        assert router.status("late") is Status.UNLOADED


async def test_a_clip_file_is_refused_with_a_reason(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    import gguf  # noqa: PLC0415

    clip = tmp_path / "proj.gguf"
    writer = gguf.GGUFWriter(str(clip), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    async with fake_router({"proj": {"model": str(clip)}}) as router, router.client() as http:
        resp = await http.post("/completion", json={"model": "proj", "prompt": "x"})
        assert resp.status_code == 400
        assert "cannot be served" in resp.json()["error"]["message"]
        item = (await http.get("/models")).json()["data"][0]
        assert item["troupe"]["gguf"]["rejected"]
        assert router.snapshot.running == 0
