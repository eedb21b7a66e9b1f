"""Busy slots with the real engine and Gemma 3 270M: more conversations than the child
has slots. Each keeps its slot while it can (by ``X-Conversation-Id``, or by the text
its requests extend); the least recently used idle slot is saved before another
conversation takes it, and a returning conversation is restored into a slot first: it
evaluates only its new tokens (``timings.prompt_n``) and answers, at temperature 0,
what a fresh child without the store answers. A full disk (the engine's write meets
ENOSPC) or an over-budget store costs the returning conversation its restore, never
a request, and leaves no entry behind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import ollama
import pytest

from troupe.demo import assemble_demo_model
from troupe.kvstore import KvStore
from troupe.kvstore.owner import SlotOwner
from troupe_rig.kv import chat, complete, kv_of, metric, text_of
from troupe_rig.realtime_client import EventLog, run_asyncio, sdk_client
from troupe_rig.router import RunningRouter, open_router, write_preset

pytestmark = pytest.mark.engine

# About 400 tokens each, over the store's threshold (256); they differ from the start.
PROMPTS = [f"Story {n}: the little village by the sea. " * 40 for n in ("one", "two", "three")]
FEW = 64  # a turn on its own or a restored slot evaluates its new tokens only
FULL = 300


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return assemble_demo_model(tmp_path_factory.mktemp("demo-model"))


@asynccontextmanager
async def router(
    tmp_path: Path, engine: Path, gemma: Path, parallel: int, *args: str, state: str = "state"
) -> AsyncIterator[RunningRouter]:
    preset = {"a": {"model": str(gemma), "ctx-size": "2048", "parallel": str(parallel)}}
    async with open_router(
        ["--models-preset", str(write_preset(tmp_path, preset)), *args],
        engine=engine,
        state_dir=tmp_path / state,
        cwd=tmp_path,
    ) as running:
        yield running


def later(prompt: str, out: dict[str, Any]) -> str:
    return prompt + text_of(out) + " And then"


async def test_three_conversations_over_two_slots_each_comes_back_restored(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    one, two, three = PROMPTS
    async with router(tmp_path, engine_path, gemma, 2) as r:
        firsts = [await complete(r, "a", p) for p in PROMPTS]
        assert all(f["timings"]["prompt_n"] > FULL for f in firsts)
        # The third took the least recently used slot (one's): one was saved first.
        assert (await kv_of(r, "a"))["entries"] == 1
        # Three is still on its slot: the engine reuses it.
        kept = await complete(r, "a", later(three, firsts[2]))
        assert kept["timings"]["prompt_n"] <= FEW, kept["timings"]
        # One comes back: two's slot is the least recently used now; two is saved and
        # one restored into it.
        back = await complete(r, "a", later(one, firsts[0]))
        assert back["timings"]["prompt_n"] <= FEW, back["timings"]
        assert back["timings"]["cache_n"] >= firsts[0]["timings"]["prompt_n"]
        assert await metric(r, "troupe_kv_restores_total", model="a", result="restored") == 1
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") == 2
        # And two, restored into three's slot (three saved in turn).
        again = await complete(r, "a", later(two, firsts[1]))
        assert again["timings"]["prompt_n"] <= FEW, again["timings"]
    async with router(tmp_path, engine_path, gemma, 2, "--kv-store", "off", state="plain") as r:
        fresh = await complete(r, "a", later(one, firsts[0]))
        assert fresh["timings"]["prompt_n"] > FULL
        assert text_of(fresh) == text_of(back)
        fresh = await complete(r, "a", later(two, firsts[1]))
        assert text_of(fresh) == text_of(again)


def _history(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"You are a patient guide to the {topic}. " * 35},
        {"role": "user", "content": f"Tell me about the {topic}."},
    ]


async def test_a_conversation_id_keeps_a_chat_on_its_slot_and_brings_it_back(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    sea, hills = _history("sea"), _history("hills")
    ids = {"sea": {"X-Conversation-Id": "sea"}, "hills": {"X-Conversation-Id": "hills"}}
    async with router(tmp_path, engine_path, gemma, 1) as r:
        first = await chat(r, "a", sea, headers=ids["sea"])
        turn = [*sea, {"role": "assistant", "content": text_of(first)}]
        turn.append({"role": "user", "content": "And the mountains?"})
        kept = await chat(r, "a", turn, headers=ids["sea"])
        assert kept["timings"]["prompt_n"] <= FEW, kept["timings"]
        await chat(r, "a", hills, headers=ids["hills"])  # takes the one slot: sea is saved
        turn += [{"role": "assistant", "content": text_of(kept)}]
        turn.append({"role": "user", "content": "And the rivers?"})
        back = await chat(r, "a", turn, headers=ids["sea"])
        assert back["timings"]["prompt_n"] <= FEW, back["timings"]
        assert await metric(r, "troupe_kv_restores_total", model="a", result="restored") == 1
    async with router(tmp_path, engine_path, gemma, 1, "--kv-store", "off", state="plain") as r:
        fresh = await chat(r, "a", turn)
        assert fresh["timings"]["prompt_n"] > FULL
        assert text_of(fresh) == text_of(back)


async def test_a_full_disk_costs_a_restore_never_a_request(
    gemma: Path, tmp_path: Path, engine_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = PROMPTS[:2]
    async with router(tmp_path, engine_path, gemma, 1) as r:
        first = await complete(r, "a", one)
        # The engine's next save lands on /dev/full: its writes fail with ENOSPC.
        slot_dir = next((tmp_path / "state" / "kv").iterdir())
        (slot_dir / "full.bin").symlink_to("/dev/full")
        monkeypatch.setattr(KvStore, "new_name", staticmethod(lambda: "full"))
        second = await complete(r, "a", two)  # takes one's slot: its save fails
        assert second["timings"]["prompt_n"] > FULL
        assert await metric(r, "troupe_kv_saves_total", model="a", result="failed") == 1
        assert (await kv_of(r, "a"))["entries"] == 0
        assert not (slot_dir / "full.bin").is_symlink()  # nothing of it stays
        monkeypatch.undo()
        # Served, with nothing of the store (the engine's own RAM cache may still hold it).
        await complete(r, "a", later(one, first))
        assert await metric(r, "troupe_kv_lookups_total", model="a", result="hit") == 0
        assert await metric(r, "troupe_kv_restores_total", model="a", result="restored") == 0
    # Its shutdown saved the last conversation: every file has its sidecar, and nothing
    # of the failed save is left to restore.
    stems = {p.stem for p in slot_dir.iterdir()}
    assert "full" not in stems
    assert {p.name for p in slot_dir.iterdir()} == {
        f"{s}{x}" for s in stems for x in (".bin", ".json")
    }


async def test_an_over_budget_store_costs_a_restore_never_a_request(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    one, two = PROMPTS[:2]
    async with router(tmp_path, engine_path, gemma, 1, "--kv-store-mib", "1") as r:
        first = await complete(r, "a", one)
        await complete(r, "a", two)  # one is saved (about 7 MiB), then dropped: over 1 MiB
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") == 1
        assert (await kv_of(r, "a"))["entries"] == 0
        await complete(r, "a", later(one, first))
        assert await metric(r, "troupe_kv_restores_total", model="a", result="restored") == 0
    assert not list((tmp_path / "state" / "kv").glob("*/*.bin"))


async def _realtime_turn(url: str) -> str:
    async with sdk_client(url) as sdk, sdk.realtime.connect(model="a") as conn:
        log = EventLog(conn)
        await log.next()
        text = {"type": "input_text", "text": "Say hi."}
        item = {"type": "message", "role": "user", "content": [text]}
        await log.send({"type": "conversation.item.create", "item": item})
        await log.send({"type": "response.create", "response": {"max_output_tokens": 4}})
        done = await log.until("response.done")
        return str(done[-1].response.status)


async def test_a_short_conversation_s_slot_is_taken_without_a_save_on_every_route(
    gemma: Path, tmp_path: Path, engine_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each route tells the store what its slot holds after the answer (the engine's
    # timings): a slot under the threshold is taken with no save (the engine would write
    # it and troupe read it back, only to drop it); one worth keeping is saved first.
    async with router(tmp_path, engine_path, gemma, 1) as r:
        kv = r.ctx.kv
        assert kv is not None
        saved: list[int] = []
        save = SlotOwner.save_one

        async def counted(
            owner: SlotOwner, slot: int, tenant: str = "", *, final: bool = False
        ) -> None:
            saved.append(slot)
            await save(owner, slot, tenant, final=final)

        monkeypatch.setattr(SlotOwner, "save_one", counted)
        await chat(r, "a", [{"role": "user", "content": "Hello there."}])
        api = ollama.AsyncClient(host=r.url, timeout=120)
        try:
            said = await api.chat(model="a", messages=[{"role": "user", "content": "Hi."}],
                                  options={"num_predict": 4})  # fmt: skip
        finally:
            await api.close()
        assert said.done
        assert await run_asyncio(_realtime_turn, r.url) in ("completed", "incomplete")
        await chat(r, "a", [{"role": "user", "content": "And once more."}])
        assert saved == []
        await complete(r, "a", PROMPTS[0])  # about 400 tokens: worth keeping
        await chat(r, "a", [{"role": "user", "content": "Short."}])
        assert saved == [0]
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") == 1
