"""The KV store with the real engine and Gemma 3 270M (sliding-window attention, so the
store's ``--swa-full`` is what makes a restored slot reusable): a conversation survives a
swap and a restart of troupe, evaluating only its new tokens (``timings.prompt_n``), with
the output of a fresh child without the store; a corrupted or truncated entry is dropped;
an entry never restores into a child with other KV arguments; a child killed mid-save
leaves no entry."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from troupe.demo import assemble_demo_model
from troupe.kvstore.engine_api import EngineApi
from troupe.proxy.upstream import Child
from troupe_rig.kv import chat, complete, kv_of, metric, text_of
from troupe_rig.router import RunningRouter, open_router, write_preset

pytestmark = pytest.mark.engine

# About 400 tokens: over the store's threshold (256), quick to evaluate on 2 cores.
HISTORY = [
    {"role": "system", "content": "You are a patient guide to the coast. " * 35},
    {"role": "user", "content": "Tell me about the sea."},
]
PROMPT = "The story of the little village by the sea. " * 40
FEW = 64  # a turn on a restored slot evaluates its new tokens only (about 35 for a chat)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return assemble_demo_model(tmp_path_factory.mktemp("demo-model"))


def sections(gemma: Path, **extra: str) -> dict[str, dict[str, str]]:
    return {
        "*": {"ctx-size": "2048"},
        "a": {"model": str(gemma), **extra},
        "b": {"model": str(gemma), "ctx-size": "512"},
    }


@asynccontextmanager
async def router(
    tmp_path: Path, preset: dict[str, dict[str, str]], *args: str, state: str = "state"
) -> AsyncIterator[RunningRouter]:
    path = write_preset(tmp_path, preset)
    async with open_router(
        ["--models-preset", str(path), "--models-max", "1", *args],
        engine=Path(_engine()),
        state_dir=tmp_path / state,
        cwd=tmp_path,
    ) as running:
        yield running


_ENGINE: list[str] = []


def _engine() -> str:
    return _ENGINE[0]


@pytest.fixture(autouse=True)
def _remember_engine(engine_path: Path) -> None:
    _ENGINE[:] = [str(engine_path)]


async def slot_action(r: RunningRouter, action: str) -> tuple[int, Any]:
    async with r.client() as http:
        body = {"model": "a", "filename": "mine.bin"}
        resp = await http.post(f"/slots/0?action={action}", json=body)
        return resp.status_code, resp.json()


def next_turn(first: dict[str, Any]) -> list[dict[str, str]]:
    return [
        *HISTORY,
        {"role": "assistant", "content": text_of(first)},
        {"role": "user", "content": "And the mountains?"},
    ]


async def test_a_chat_survives_a_swap_and_answers_as_a_fresh_child_would(
    gemma: Path, tmp_path: Path
) -> None:
    async with router(tmp_path, sections(gemma)) as r:
        first = await chat(r, "a", HISTORY)
        assert first["timings"]["prompt_n"] > 300
        await complete(r, "b", "Hello")  # a is swapped out: its slot is saved
        assert (await kv_of(r, "a"))["entries"] == 1
        assert (await kv_of(r, "a"))["bytes"] > 1 << 20
        second = await chat(r, "a", next_turn(first))
        assert second["timings"]["prompt_n"] <= FEW, second["timings"]
        assert second["timings"]["cache_n"] >= first["timings"]["prompt_n"]
        assert await metric(r, "troupe_kv_restores_total", model="a", result="restored") == 1
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") >= 1
        ours = await slot_action(r, "save")  # the store's files are not the client's
    # The same turn on a fresh child, no store: the same words at temperature 0.
    async with router(tmp_path, sections(gemma), "--kv-store", "off", state="plain") as r:
        fresh = await chat(r, "a", next_turn(first))
        assert fresh["timings"]["prompt_n"] > 300
        assert ours == await slot_action(r, "save")  # the engine's own refusal, as without
        assert ours[0] == 501
        assert text_of(fresh) == text_of(second)
        async with r.client() as http:
            models = (await http.get("/models")).json()["data"]
        assert all("kv" not in m["troupe"] for m in models)
        args = {m["id"]: m["status"]["args"] for m in models}
        assert "--slot-save-path" not in args["a"]


async def test_a_conversation_survives_a_restart_of_troupe(gemma: Path, tmp_path: Path) -> None:
    async with router(tmp_path, sections(gemma)) as r:
        first = await complete(r, "a", PROMPT)
    # troupe's shutdown saved the slot; a new troupe on the same state dir finds it.
    async with router(tmp_path, sections(gemma)) as r:
        assert (await kv_of(r, "a"))["entries"] == 1
        second = await complete(r, "a", PROMPT + text_of(first) + " And then")
        assert second["timings"]["prompt_n"] <= FEW, second["timings"]
    async with router(tmp_path, sections(gemma), "--kv-store", "off", state="plain") as r:
        fresh = await complete(r, "a", PROMPT + text_of(first) + " And then")
        assert text_of(fresh) == text_of(second)


async def test_a_corrupted_or_truncated_entry_is_dropped_and_the_request_still_served(
    gemma: Path, tmp_path: Path
) -> None:
    # The engine's default moves an idle slot into its RAM prompt cache (which the slot
    # API cannot reach) when another slot takes a task: here each keeps its own.
    idle_kept = sections(gemma, **{"cache-idle-slots": "false"})
    async with router(tmp_path, idle_kept) as r:
        await complete(r, "a", PROMPT, id_slot=0)
        await chat(r, "a", HISTORY, id_slot=1)  # a second conversation, on another slot
    files = sorted((tmp_path / "state" / "kv").glob("*/*.bin"))
    assert len(files) == 2
    flipped, truncated = files
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    flipped.write_bytes(bytes(data))
    with truncated.open("r+b") as f:
        f.truncate(truncated.stat().st_size // 2)
    async with router(tmp_path, idle_kept) as r:
        assert (await kv_of(r, "a"))["entries"] == 1  # the truncated one is gone at start
        out1 = await complete(r, "a", PROMPT + " And then")
        out2 = await chat(r, "a", HISTORY)
        # Both evaluated in full: the corrupt entry was caught before its restore.
        assert out1["timings"]["prompt_n"] + out2["timings"]["prompt_n"] > 600
        assert (await kv_of(r, "a"))["entries"] == 0
        assert await metric(r, "troupe_kv_restores_total", model="a", result="corrupt") == 1
        assert await metric(r, "troupe_kv_restores_total", model="a", result="restored") == 0
    assert not flipped.exists()
    assert not truncated.exists()


async def test_an_entry_never_restores_into_a_child_with_other_kv_arguments(
    gemma: Path, tmp_path: Path
) -> None:
    async with router(tmp_path, sections(gemma)) as r:
        first = await complete(r, "a", PROMPT)
    async with router(tmp_path, sections(gemma, **{"cache-type-k": "q8_0"})) as r:
        second = await complete(r, "a", PROMPT + text_of(first) + " And then")
        assert second["timings"]["prompt_n"] > 300  # nothing restored
        assert await metric(r, "troupe_kv_restores_total", model="a", result="restored") == 0
        # The entry of its old arguments is gone; the one saved now is of the new ones.
        assert (await kv_of(r, "a"))["entries"] == 0


async def test_an_over_budget_store_keeps_nothing_and_never_fails_a_request(
    gemma: Path, tmp_path: Path
) -> None:
    async with router(tmp_path, sections(gemma), "--kv-store-mib", "1") as r:
        first = await complete(r, "a", PROMPT)
        await complete(r, "b", "Hello")  # a's slot (about 7 MiB) is saved, then evicted
        assert (await kv_of(r, "a"))["entries"] == 0
        second = await complete(r, "a", PROMPT + text_of(first) + " And then")
        assert second["timings"]["prompt_n"] > 300
        assert await metric(r, "troupe_kv_saves_total", model="a", result="saved") == 1
    assert not list((tmp_path / "state" / "kv").glob("*/*.bin"))


async def test_the_entries_of_a_model_that_left_the_catalog_are_dropped(
    gemma: Path, tmp_path: Path
) -> None:
    async with router(tmp_path, sections(gemma)) as r:
        await complete(r, "a", PROMPT)
    assert len(list((tmp_path / "state" / "kv").glob("*/*.bin"))) == 1
    only_b = {"b": sections(gemma)["b"]}
    async with router(tmp_path, only_b) as r:
        assert (await kv_of(r, "b"))["entries"] == 0
    assert not list((tmp_path / "state" / "kv").glob("*/*.bin"))


async def test_a_child_killed_mid_save_leaves_no_entry(
    gemma: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_call = EngineApi.call
    killed: list[int] = []

    async with router(tmp_path, sections(gemma)) as r:

        async def call_then_die(
            api: EngineApi,
            child: Child,
            method: str,
            path: str,
            payload: Any = None,
            *,
            final: bool = False,
        ) -> Any:
            if "action=save" in path and not killed:
                # The engine has begun writing: part of a file, then the child dies.
                target = next((tmp_path / "state" / "kv").glob("*")) / payload["filename"]
                target.write_bytes(b"ggsq" + b"\0" * 4096)
                pid = r.snapshot.models["a"].pid
                assert pid
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            return await real_call(api, child, method, path, payload, final=final)

        monkeypatch.setattr(EngineApi, "call", call_then_die)
        first = await complete(r, "a", PROMPT)
        await complete(r, "b", "Hello")  # a's stop: its save meets a dead child
        assert killed
        assert (await kv_of(r, "a"))["entries"] == 0
        assert await metric(r, "troupe_kv_saves_total", model="a", result="failed") == 1
    assert not list((tmp_path / "state" / "kv").glob("*/*.bin"))
    monkeypatch.setattr(EngineApi, "call", real_call)
    async with router(tmp_path, sections(gemma)) as r:
        second = await complete(r, "a", PROMPT + text_of(first) + " And then")
        assert second["timings"]["prompt_n"] > 300  # nothing restored, served in full
