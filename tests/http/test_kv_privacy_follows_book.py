"""The KV store's tenant privacy follows the live tenant book (real engine): a router
started with one tenant whose book is replaced by two keys keeps them apart from then
on, also on the child that was started for one tenant (its requests are then neither
steered nor served from another tenant's cached prompt, until it restarts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from troupe.tenants.model import Tenants
from troupe_rig import write_tiny_models
from troupe_rig.router import open_router

MODEL = "m-kv-book"
ALICE = {"Authorization": "Bearer k-alice"}
BOB = {"Authorization": "Bearer k-bob"}
PROMPT = "The harbour records list every ship that came in and went out. " * 8


async def cached(http: httpx.AsyncClient, headers: dict[str, str]) -> int:
    """How many of the prompt's tokens the engine took from its cache for this answer."""
    body = {"model": MODEL, "prompt": PROMPT, "n_predict": 2, "temperature": 0}
    answer = await http.post("/completion", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["timings"]["cache_n"])


async def test_privacy_follows_a_replaced_book(engine_path: Path, tmp_path: Path) -> None:
    write_tiny_models(tmp_path / "models", [MODEL])
    args = ["--models-dir", str(tmp_path / "models"), "--ctx-size", "1024", "--parallel", "1"]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "state") as router,
        router.client(timeout=120) as http,
    ):
        # One tenant: the child starts as it would without tenants, and a returning
        # prompt is served from its slot's cache.
        await cached(http, {})
        assert await cached(http, {}) > 0
        router.ctx.tenants.replace(Tenants.from_keys(["k-alice", "k-bob"], ["alice", "bob"]))
        await cached(http, ALICE)
        # Bob's same prompt on the one slot that holds Alice's: nothing reused.
        assert await cached(http, BOB) == 0
        slots = await http.get("/slots", params={"model": MODEL}, headers=ALICE)
        assert slots.status_code == 200
        found: list[dict[str, Any]] = slots.json()
        # Bob's task left no trace in Alice's view of the slots.
        assert all("id_task" not in s for s in found), found
