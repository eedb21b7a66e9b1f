"""The KV store between tenants, its files' modes and its own check of a restore, with the
real engine and Gemma 3 270M.

With two named keys and one slot, Bob's request with Alice's prompt takes the slot that
holds her conversation: nothing of it is reused (``cached_tokens`` 0) and it is not
restored from her saved entry, while Alice, and then Bob, each get their own restored.
A request that names Alice's slot itself reuses nothing either, nor does another tenant's
guess after a restart of troupe. The store's directories
are 0700 and its files 0600. A child of a sliding-window model started without
``--swa-full`` ignores a restore (it re-evaluates the whole prompt): the store sees it in
the first answer, stops restoring for that model and says so in ``/models``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from troupe.demo import assemble_demo_model
from troupe.specs import ChildSpecs
from troupe_rig.kv import complete, kv_of, metric, text_of
from troupe_rig.router import RunningRouter, open_router, write_preset

pytestmark = pytest.mark.engine

# About 400 tokens, over the store's save threshold (256); Alice's secret in it.
SECRET = "The vault access code is 4729. " + "Keep the harbour records in order. " * 45
ALICE = {"Authorization": "Bearer k-alice"}
BOB = {"Authorization": "Bearer k-bob"}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return assemble_demo_model(tmp_path_factory.mktemp("demo-model"))


def preset(tmp_path: Path, gemma: Path) -> Path:
    return write_preset(tmp_path, {"a": {"model": str(gemma), "ctx-size": "2048", "parallel": "1"}})


async def ask(r: RunningRouter, headers: dict[str, str], prompt: str, **extra: object) -> Any:
    async with r.client(timeout=120) as http:
        body = {"model": "a", "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}
        resp = await http.post("/v1/completions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        return resp.json()


async def kv_state(r: RunningRouter) -> dict[str, Any]:
    async with r.client() as http:
        data = (await http.get("/models")).json()["data"]
    found: dict[str, Any] = {m["id"]: m for m in data}["a"]["troupe"]["kv"]
    return found


async def restored(r: RunningRouter, headers: dict[str, str] | None = None) -> float:
    return await metric(r, "troupe_kv_restores_total", headers, model="a", result="restored")


def cached(out: dict[str, Any]) -> int:
    """What the answer says it reused: both of its counts, which must agree."""
    n = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert n == out["timings"]["cache_n"]
    return int(n)


async def test_a_tenant_never_reuses_nor_restores_another_s_conversation(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice:k-alice\nbob:k-bob\ncarol:k-carol\n")
    args = ["--models-preset", str(preset(tmp_path, gemma)), "--named-api-keys", str(keys)]
    state = tmp_path / "state"
    async with open_router(args, engine=engine_path, state_dir=state, cwd=tmp_path) as r:
        first = await ask(r, ALICE, SECRET)
        assert first["timings"]["prompt_n"] > 300
        # Bob guesses Alice's prompt: her slot is the only one, and holds it.
        probe = await ask(r, BOB, SECRET + " And then")
        assert cached(probe) == 0
        assert probe["timings"]["prompt_n"] > 300
        assert await restored(r, ALICE) == 0
        # Alice's conversation was saved as Bob took her slot: she gets it back.
        again = await ask(r, ALICE, SECRET + text_of(first) + " And then")
        assert cached(again) > 300
        assert await restored(r, ALICE) == 1
        # And Bob gets his own back (saved as Alice took the slot again).
        bob_again = await ask(r, BOB, SECRET + " And then, later")
        assert cached(bob_again) > 300
        assert await restored(r, ALICE) == 2
        # Alice's again; Bob naming her slot himself reuses nothing of it either.
        assert cached(await ask(r, ALICE, SECRET + text_of(first) + " Once more")) > 300
        pinned = await ask(r, BOB, SECRET + text_of(first) + " Once more", id_slot=0)
        assert cached(pinned) == 0
        assert (await kv_of(r, "a", ALICE))["entries"] >= 2
    # After a restart of troupe, Carol's guess (Bob's entries are his own, and hold
    # what he guessed) restores nothing of Alice's.
    async with open_router(args, engine=engine_path, state_dir=state, cwd=tmp_path) as r:
        carol = {"Authorization": "Bearer k-carol"}
        assert cached(await ask(r, carol, SECRET + text_of(first) + " After a restart")) == 0
        assert await restored(r, ALICE) == 0
        assert cached(await ask(r, ALICE, SECRET + text_of(first) + " After a restart")) > 300
        assert await restored(r, ALICE) == 1
    kv = state / "kv"
    files = list(kv.glob("*/*"))
    assert {f.suffix for f in files} == {".bin", ".json"}
    assert stat.S_IMODE(os.stat(kv).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(d).st_mode) == 0o700 for d in kv.iterdir())
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)


# Over Gemma 3's sliding window (512 tokens): without --swa-full the child keeps only the
# window's cells, and a restored slot's older tokens cannot be reused.
LONG = "The story of the little village by the sea, and of its harbour. " * 55
OTHER = "A list of the mountains and their rivers, one after another. " * 55


async def test_a_restore_the_engine_ignores_switches_restores_off_for_the_model(
    gemma: Path,
    tmp_path: Path,
    engine_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The store's own --swa-full left out: the child keeps what a SWA model keeps.
    monkeypatch.setattr(ChildSpecs, "_uses_swa", lambda self, entry: False)
    args = ["--models-preset", str(preset(tmp_path, gemma))]
    async with open_router(args, engine=engine_path, state_dir=tmp_path / "s", cwd=tmp_path) as r:
        first = await complete(r, "a", LONG)
        assert first["timings"]["prompt_n"] > 700
        await complete(r, "a", OTHER)  # takes the one slot: LONG is saved first
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") == 1
        assert (await kv_state(r))["restore"] == "on"
        back = await complete(r, "a", LONG + text_of(first) + " And then")
        assert await restored(r) == 1
        assert back["timings"]["cache_n"] == 0  # the engine evaluated it all again
        # (OTHER was saved as LONG took the slot back, before the restore.)
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") == 2
        kv = await kv_state(r)
        assert kv["restore"] == "off"
        assert "reused none of" in str(kv["restore_off"])
        assert await metric(r, "troupe_kv_restores_total", model="a", result="ignored") == 1
        # Off: the next conversation to take the slot saves nothing of it first.
        await complete(r, "a", "Hello")
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") == 2
        assert await restored(r) == 1
    assert "KV: restores switched off for this model" in caplog.text


async def test_with_the_store_off_a_tenant_still_never_reuses_another_s_prefix(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    # --kv-store off: no files, but the engine's own slot reuse would still hand Bob
    # Alice's cached prefix (and tell him in cached_tokens how far his guess matched).
    keys = tmp_path / "keys"
    keys.write_text("alice:k-alice\nbob:k-bob\n")
    args = ["--models-preset", str(preset(tmp_path, gemma)), "--named-api-keys", str(keys)]
    state = tmp_path / "state"
    async with open_router([*args, "--kv-store", "off"], engine=engine_path, state_dir=state) as r:
        first = await ask(r, ALICE, SECRET)
        assert first["timings"]["prompt_n"] > 300
        # Alice's own next turn reuses her prefix from the slot.
        turn = await ask(r, ALICE, SECRET + text_of(first) + " And then")
        assert cached(turn) > 300
        # Bob guesses her prompt: the one slot holds it, and nothing of it is reused.
        probe = await ask(r, BOB, SECRET + text_of(first) + " And then, later")
        assert cached(probe) == 0
        assert probe["timings"]["prompt_n"] > 300
        # Nor when he names her slot himself, once she is back on it.
        assert cached(await ask(r, ALICE, SECRET + " Once more")) == 0  # Bob's tokens there
        assert cached(await ask(r, ALICE, SECRET + " Once more, again")) > 300
        pinned = await ask(r, BOB, SECRET + " Once more, again", id_slot=0)
        assert cached(pinned) == 0
        # No files: the store is off.
        assert not (state / "kv").exists()
        async with r.client() as http:
            data = (await http.get("/models", headers=ALICE)).json()["data"]
        assert "kv" not in {m["id"]: m for m in data}["a"]["troupe"]
