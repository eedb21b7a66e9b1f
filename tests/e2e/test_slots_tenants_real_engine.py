"""``GET /slots`` between tenants, with the real engine and Gemma 3 270M.

With two named keys, Alice's long prompt leaves no trace in Bob's ``GET /slots`` (each
slot shown as the engine shows one that never served: ``id``, ``n_ctx``, ``speculative``,
not processing), while Alice sees her own slot's task; once Bob's request takes that
slot, it is his to see and no longer hers. ``LLAMA_SERVER_SLOTS_DEBUG`` in troupe's
environment does not reach such children (the engine would add every slot's prompt
text). The same with ``--kv-store off``. With one key, the answer is the engine's own,
byte for byte, debug text included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from troupe.demo import assemble_demo_model
from troupe_rig.router import RunningRouter, open_router, write_preset

pytestmark = pytest.mark.engine

SECRET = "The vault access code is 4729. " + "Keep the harbour records in order. " * 45
ALICE = {"Authorization": "Bearer k-alice"}
BOB = {"Authorization": "Bearer k-bob"}
DEBUG = {**os.environ, "LLAMA_SERVER_SLOTS_DEBUG": "1"}
IDLE_KEYS = ["id", "n_ctx", "speculative", "is_processing"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return assemble_demo_model(tmp_path_factory.mktemp("demo-model"))


def preset(tmp_path: Path, gemma: Path) -> Path:
    return write_preset(tmp_path, {"a": {"model": str(gemma), "ctx-size": "2048", "parallel": "1"}})


async def ask(r: RunningRouter, headers: dict[str, str], prompt: str) -> None:
    async with r.client(timeout=120) as http:
        body = {"model": "a", "prompt": prompt, "max_tokens": 4, "temperature": 0}
        resp = await http.post("/v1/completions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text


async def slots(r: RunningRouter, headers: dict[str, str]) -> list[dict[str, Any]]:
    async with r.client() as http:
        resp = await http.get("/slots", params={"model": "a"}, headers=headers)
    assert resp.status_code == 200, resp.text
    found: list[dict[str, Any]] = resp.json()
    assert found, "a child has at least one slot"
    return found


def untouched(found: list[dict[str, Any]]) -> bool:
    """Every slot as the engine shows one that never served."""
    return all(list(s) == IDLE_KEYS and s["is_processing"] is False for s in found)


@pytest.mark.parametrize("store", ["on", "off"])
async def test_a_tenant_sees_only_its_own_requests_in_slots(
    gemma: Path, tmp_path: Path, engine_path: Path, store: str
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice:k-alice\nbob:k-bob\n")
    args = ["--models-preset", str(preset(tmp_path, gemma)), "--named-api-keys", str(keys)]
    args += ["--kv-store", store]
    async with open_router(
        args, engine=engine_path, state_dir=tmp_path / "s", environ=DEBUG, cwd=tmp_path
    ) as r:
        await ask(r, ALICE, SECRET)
        assert untouched(await slots(r, BOB))
        mine = [s for s in await slots(r, ALICE) if "id_task" in s]
        assert len(mine) == 1
        assert mine[0]["n_prompt_tokens"] > 300
        assert "prompt" not in mine[0]  # the debug text is off in this child
        # Bob's request takes the one slot: now his to see, and no longer hers.
        await ask(r, BOB, "Hello there, how are you?")
        assert untouched(await slots(r, ALICE))
        his = [s for s in await slots(r, BOB) if "id_task" in s]
        assert len(his) == 1
        assert his[0]["n_prompt_tokens"] < 50


async def test_with_one_key_slots_is_the_engine_s_own_answer(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    args = ["--models-preset", str(preset(tmp_path, gemma)), "--api-key", "k-alice"]
    async with open_router(
        args, engine=engine_path, state_dir=tmp_path / "s", environ=DEBUG, cwd=tmp_path
    ) as r:
        await ask(r, ALICE, SECRET)
        async with r.client() as http:
            ours = await http.get("/slots", params={"model": "a"}, headers=ALICE)
        port = r.ctx.scheduler.snapshot.models["a"].port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as direct:
            engine = await direct.get("/slots", params={"model": "a"})
    assert ours.status_code == engine.status_code == 200
    assert ours.content == engine.content
    assert "4729" in ours.json()[0]["prompt"]  # one tenant: the engine's debug text shown
