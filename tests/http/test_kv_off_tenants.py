"""``--kv-store off`` with several named keys: no files, but the KV service
still keeps tenants apart on the slots, and children run without the engine's RAM
prompt cache. With one key (or none), ``--kv-store off`` leaves the children and every
request as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from troupe_rig.router import RouterFactory, RunningRouter


async def loaded(router: RunningRouter, headers: dict[str, str]) -> dict[str, Any]:
    """Model ``a`` loaded by a completion; its ``/models`` entry."""
    async with router.client() as http:
        body = {"model": "a", "prompt": "hello", "max_tokens": 2}
        resp = await http.post("/v1/completions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        data = (await http.get("/models", headers=headers)).json()["data"]
    found: dict[str, Any] = {m["id"]: m for m in data}["a"]
    return found


async def test_with_several_keys_the_store_off_still_keeps_tenants_apart(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice:k-alice\nbob:k-bob\n")
    args = ("--named-api-keys", str(keys), "--kv-store", "off")
    async with fake_router({"a": {}}, *args) as router:
        kv = router.ctx.kv
        assert kv is not None
        assert kv.store is None
        assert kv.private
        model = await loaded(router, {"Authorization": "Bearer k-alice"})
        child = model["status"]["args"]
        assert child[child.index("--cache-ram") + 1] == "0"
        assert "--no-cache-idle-slots" in child
        assert "--slot-save-path" not in child
        assert "kv" not in model["troupe"]  # no store to show
    assert not (tmp_path / "state" / "kv").exists()


async def test_with_one_key_the_store_off_leaves_children_and_requests_alone(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-key", "k-one", "--kv-store", "off") as router:
        assert router.ctx.kv is None  # nothing on the request path
        model = await loaded(router, {"Authorization": "Bearer k-one"})
        child = model["status"]["args"]
        assert not {"--cache-ram", "--no-cache-idle-slots", "--slot-save-path"} & set(child)
