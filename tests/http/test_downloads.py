"""``POST /models`` downloads through the router, against the loopback hub.

The fake engine stands in for llama-server (nothing is loaded here); tests that load
what was downloaded use the real engine (tests/e2e/test_downloads_real_engine.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import trio

from troupe.catalog.hfcache import cached_models
from troupe.download.journal import Journal
from troupe_rig.events import collect_until, drain
from troupe_rig.hub import Fault, Hub
from troupe_rig.router import RouterFactory, RunningRouter

MODEL = "m-Q4_K_M.gguf"
ENDED = ("download_finished", "download_failed")


def hub_env(hub: Hub, cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    return {**env, "LLAMA_CACHE": str(cache), "MODEL_ENDPOINT": hub.url, **extra}


async def download(
    router: RunningRouter, http: httpx.AsyncClient, name: str, last: tuple[str, ...] = ENDED
) -> list[dict[str, Any]]:
    """POST it and return the events up to the first of ``last`` (and the reload after an
    ended download)."""
    with router.ctx.scheduler.subscribe() as events:
        resp = await http.post("/models", json={"model": name})
        assert resp.json() == {"success": True}
        with trio.fail_after(30):
            got = await collect_until(events, lambda e: e["event"] in last)
            if got[-1]["event"] in ENDED:
                got += await collect_until(events, lambda e: e["event"] == "models_reload")
    return got


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """Event names, consecutive progress events folded into one."""
    out: list[str] = []
    for e in events:
        if not (out and out[-1] == e["event"] == "download_progress"):
            out.append(e["event"])
    return out


async def ids(http: httpx.AsyncClient) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in (await http.get("/models")).json()["data"]}


async def test_a_download_is_listed_under_its_tag_after_the_events_upstream_sends(
    fake_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", {MODEL: tiny_files[MODEL], "m-Q8_0.gguf": tiny_files["m-Q8_0.gguf"]})
    cache = tmp_path / "cache"
    async with (
        fake_router({"local": {}}, environ=hub_env(hub, cache)) as router,
        router.client() as http,
    ):
        events = await download(router, http, "org/tiny")
        assert kinds(events) == [
            "model_status",
            "download_progress",
            "download_finished",
            "models_reload",
        ]
        assert events[0] == {
            "model": "org/tiny",
            "event": "model_status",
            "data": {"status": "downloading"},
        }
        progress = next(e for e in reversed(events) if e["event"] == "download_progress")
        (url,) = progress["data"]["progress"]
        size = tiny_files[MODEL].stat().st_size
        assert url == hub.file_url("org/tiny", MODEL)
        assert progress["data"]["progress"][url] == {"done": size, "total": size}
        listed = await ids(http)
        assert listed == {"local": "unloaded", "org/tiny:Q4_K_M": "unloaded"}  # not "org/tiny"
        assert cached_models(cache) == ["org/tiny:Q4_K_M"]
        item = next(m for m in (await http.get("/models")).json()["data"] if m["id"] != "local")
        assert (item["source"], item["can_remove"]) == ("cache", True)


async def test_a_downloading_entry_is_listed_and_an_unload_cancels_it(
    fake_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", {MODEL: tiny_files[MODEL]})
    hub.fault("org/tiny", MODEL, Fault(stall_at=100_000))
    cache = tmp_path / "cache"
    async with (
        fake_router({"local": {}}, environ=hub_env(hub, cache)) as router,
        router.client() as http,
        trio.open_nursery() as nursery,
    ):
        with router.ctx.scheduler.subscribe() as events:
            assert (await http.post("/models", json={"model": "org/tiny"})).status_code == 200
            await collect_until(
                events,
                lambda e: (
                    e["event"] == "download_progress"
                    and any(v["done"] for v in e["data"]["progress"].values())
                ),
            )
            item = next(
                m for m in (await http.get("/models")).json()["data"] if m["id"] == "org/tiny"
            )
            assert item["status"] == {"value": "downloading", "args": []}
            assert (item["source"], item["aliases"], item["tags"]) == ("cache", [], [])
            assert "preset" not in item["status"]
            load = await http.post("/models/load", json={"model": "org/tiny"})
            assert load.json() == {"success": True}  # upstream: not unloaded, nothing to do
            assert router.snapshot.running == 0
            again = await http.post("/models", json={"model": "org/tiny"})
            assert (again.status_code, again.json()["error"]["message"]) == (
                400,
                "model 'org/tiny' already exists",
            )
            resp = await http.post("/models/unload", json={"model": "org/tiny"})
            assert resp.json() == {"success": True}
            # Answered once the job has ended: its download_failed was sent before.
            rest = drain(events)
            assert "download_failed" in [e["event"] for e in rest]
            if "models_reload" not in [e["event"] for e in rest]:  # the reload may be done
                rest += await collect_until(events, lambda e: e["event"] == "models_reload")
        assert [e["event"] for e in rest if e["event"] != "download_progress"] == [
            "download_failed",
            "models_reload",
        ]
        failed = next(e for e in rest if e["event"] == "download_failed")
        assert failed == {
            "model": "org/tiny",
            "event": "download_failed",
            "data": {"reason": "cancelled"},
        }
        assert "org/tiny" not in await ids(http)
        assert list(cache.rglob("*.downloadInProgress")) == []
        assert not (cache / "models--org--tiny").exists()
        nursery.cancel_scope.cancel()


async def test_delete_cancels_a_download_and_removes_it(
    fake_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", {MODEL: tiny_files[MODEL]})
    hub.fault("org/tiny", MODEL, Fault(stall_at=100_000))
    cache = tmp_path / "cache"
    async with (
        fake_router({"local": {}}, environ=hub_env(hub, cache)) as router,
        router.client() as http,
    ):
        with router.ctx.scheduler.subscribe() as events:
            await http.post("/models", json={"model": "org/tiny:Q4_K_M"})
            await collect_until(events, lambda e: e["event"] == "download_progress")
            resp = await http.delete("/models", params={"model": "org/tiny:Q4_K_M"})
            assert resp.json() == {"success": True}
            got = await collect_until(events, lambda e: e["event"] == "model_remove")
        assert [e["event"] for e in got if e["event"] != "download_progress"] == [
            "download_failed",
            "models_reload",  # troupe's removals reload (upstream erases the entry alone)
            "model_remove",
        ]
        assert "org/tiny:Q4_K_M" not in await ids(http)
        assert "org/tiny:Q4_K_M" not in router.snapshot.downloads
        assert list(cache.rglob("*.downloadInProgress")) == []


async def test_unknown_repo_tag_and_private_repo_fail_with_the_hubs_reason(
    fake_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", {MODEL: tiny_files[MODEL]})
    hub.add_repo("org/private", {MODEL: tiny_files[MODEL]}, private=True)
    async with (
        fake_router({"local": {}}, environ=hub_env(hub, tmp_path / "cache")) as router,
        router.client() as http,
    ):
        cases = {
            "org/missing": (404, "Repository not found"),
            "org/tiny:Q2_K": (404, "no GGUF file with tag 'Q2_K'"),
            "org/private": (401, "restricted"),
        }
        for name, (status, reason) in cases.items():
            events = await download(router, http, name)
            assert kinds(events) == ["model_status", "download_failed", "models_reload"]
            failed = events[1]
            assert failed["model"] == name
            assert failed["data"]["status"] == status
            assert reason in failed["data"]["reason"]
            assert set(await ids(http)) == {"local"}  # never lists what it does not have


async def test_a_token_opens_a_private_repo(
    fake_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.add_repo("org/private", {MODEL: tiny_files[MODEL]}, private=True)
    env = hub_env(hub, tmp_path / "cache")
    async with (
        fake_router({"local": {}}, "--hf-token", hub.token, environ=env) as router,
        router.client() as http,
    ):
        events = await download(router, http, "org/private")
        assert "download_finished" in kinds(events)
        assert all(r.authorized for r in hub.gets(MODEL))
        assert "org/private:Q4_K_M" in await ids(http)


async def test_two_downloads_that_share_files_are_refused(
    fake_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", {MODEL: tiny_files[MODEL]})
    hub.fault("org/tiny", MODEL, Fault(stall_at=100_000))
    async with (
        fake_router({"local": {}}, environ=hub_env(hub, tmp_path / "cache")) as router,
        router.client() as http,
    ):
        assert (await http.post("/models", json={"model": "org/tiny:Q4_K_M"})).status_code == 200
        resp = await http.post("/models", json={"model": "org/tiny"})  # the same file
        assert resp.status_code == 400
        assert resp.json()["error"] == {
            "code": 400,
            "message": "model 'org/tiny' shares files with 'org/tiny:Q4_K_M', which is downloading",
            "type": "invalid_request_error",
        }
        assert set(router.snapshot.downloads) == {"org/tiny:Q4_K_M"}


async def test_shutdown_pauses_and_the_next_router_resumes_from_the_journal(
    fake_router: RouterFactory, hub: Hub, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", {MODEL: tiny_files[MODEL]})
    size = tiny_files[MODEL].stat().st_size
    hub.fault("org/tiny", MODEL, Fault(stall_at=size // 2))
    env = hub_env(hub, tmp_path / "cache")
    async with fake_router({"local": {}}, environ=env) as router, router.client() as http:
        with router.ctx.scheduler.subscribe() as events:
            await http.post("/models", json={"model": "org/tiny"})
            await collect_until(
                events,
                lambda e: (
                    e["event"] == "download_progress"
                    and any(v["done"] >= size // 2 for v in e["data"]["progress"].values())
                ),
            )
    (entry,) = Journal(tmp_path / "state").entries()
    assert (entry.plan.name, entry.origin) == ("org/tiny", "router")
    hub.fault("org/tiny", MODEL, None)
    async with fake_router({"local": {}}, environ=env) as router, router.client() as http:
        with router.ctx.scheduler.subscribe() as events:
            if "org/tiny:Q4_K_M" not in router.ctx.catalog:
                await collect_until(events, lambda e: e["event"] == "models_reload")
        assert "org/tiny:Q4_K_M" in await ids(http)
    assert hub.gets(MODEL)[-1].range == f"bytes={size // 2}-"
    assert Journal(tmp_path / "state").entries() == []
