"""Tenants and secrets with the real llama-server.

A resumable stream (``X-Conversation-Id``) belongs to the key that started it: with
several named keys, another key's replay, lookup and stop meet an unknown id, while the
owner replays its whole answer. The hub token (``--hf-token``) reaches a child in its
environment (``HF_TOKEN``, which the engine reads for the flag), never on its command
line, and no route that shows a child's arguments or preset shows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.sched import Status
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

CHILD_ARGS = ("--ctx-size", "256", "--parallel", "1")
TOKEN = "hf_tenant_test_SECRET_0123456789"


async def test_a_stream_is_its_owners_only(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice:k-alice\nbob:k-bob\n")
    alice = {"Authorization": "Bearer k-alice"}
    bob = {"X-Api-Key": "k-bob"}
    args = ["--models-dir", str(tiny_model_dir), "--named-api-keys", str(keys), *CHILD_ARGS]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "state", cwd=tmp_path) as r,
        r.client(timeout=60) as http,
    ):
        # Loaded first: a stream that waits for the load gets troupe's progress comments
        # ahead of the child's events, which a replay (the child's own) does not hold.
        warm = {"model": "tiny-a", "prompt": "hi", "max_tokens": 1}
        assert (await http.post("/v1/completions", json=warm, headers=alice)).status_code == 200
        body = {"model": "tiny-a", "prompt": "hello", "max_tokens": 6, "stream": True}
        first = await http.post(
            "/v1/completions", json=body, headers={**alice, "X-Conversation-Id": "conv-a"}
        )
        assert first.status_code == 200
        assert "data: " in first.text

        unknown = await http.get("/v1/stream", params={"conv_id": "nobody"}, headers=bob)
        theirs = await http.get("/v1/stream", params={"conv_id": "conv-a"}, headers=bob)
        assert (theirs.status_code, theirs.content) == (404, unknown.content)
        lookup = {"conversation_ids": ["conv-a"]}
        assert (await http.post("/v1/streams/lookup", json=lookup, headers=bob)).json() == []
        stop = await http.delete("/v1/stream", params={"conv_id": "conv-a"}, headers=bob)
        assert stop.status_code == 204

        # Bob's own conversation of the same id: his, beside hers (in the child too).
        his_body = {**body, "prompt": "another", "max_tokens": 3}
        his = await http.post(
            "/v1/completions", json=his_body, headers={**bob, "X-Conversation-Id": "conv-a"}
        )
        assert his.status_code == 200
        assert his.text != first.text
        replay = await http.get("/v1/stream", params={"conv_id": "conv-a"}, headers=bob)
        assert replay.text == his.text

        # Bob's stop stopped nothing: alice replays her whole answer.
        replay = await http.get("/v1/stream", params={"conv_id": "conv-a"}, headers=alice)
        assert replay.status_code == 200
        assert replay.text == first.text
        found = (await http.post("/v1/streams/lookup", json=lookup, headers=alice)).json()
        assert [item["conversation_id"] for item in found] == ["conv-a"]
        assert found[0]["total_bytes"] == len(first.content)
        assert (
            await http.delete("/v1/stream", params={"conv_id": "conv-a"}, headers=alice)
        ).status_code == 204
        assert (await http.post("/v1/streams/lookup", json=lookup, headers=alice)).json() == []

        # /troupe/requests: no key, no list; bob's list has none of alice's records.
        assert (await http.get("/troupe/requests")).status_code == 401
        mine = (await http.get("/troupe/requests", params={"kind": "all"}, headers=bob)).json()
        assert mine["data"]
        assert all(item["tenant"] == "bob" for item in mine["data"])
        completions = [i for i in mine["data"] if i["path"] == "/v1/completions"]
        assert len(completions) == 1  # his own, not alice's
        hers = (await http.get("/troupe/requests", headers=alice)).json()["data"]
        assert sorted((i["path"], i["conversation"] or "") for i in hers) == [
            ("/v1/completions", ""),  # the warm-up
            ("/v1/completions", "conv-a"),
        ]


def _proc(pid: int, name: str) -> list[bytes]:
    return Path(f"/proc/{pid}/{name}").read_bytes().split(b"\0")


async def test_the_hub_token_reaches_a_child_by_its_environment_and_is_never_shown(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--models-dir", str(tiny_model_dir), "--hf-token", TOKEN, *CHILD_ARGS]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "state", cwd=tmp_path) as r,
        r.client(timeout=60) as http,
    ):
        assert (await http.post("/models/load", json={"model": "tiny-a"})).status_code == 200
        snap = await r.wait_for_status("tiny-a", Status.LOADED)
        pid = snap.models["tiny-a"].pid
        assert pid
        cmdline = _proc(pid, "cmdline")
        assert any(arg.endswith(b"llama-server") for arg in cmdline[:2]), cmdline[:2]
        assert not [arg for arg in cmdline if TOKEN.encode() in arg]
        assert b"--hf-token" not in cmdline
        assert f"HF_TOKEN={TOKEN}".encode() in _proc(pid, "environ")
        # The memory measurement's child too.
        argv, env = r.ctx.specs.measure_command("tiny-a")
        assert TOKEN not in " ".join(argv)
        assert env["HF_TOKEN"] == TOKEN
        # The child serves with it (the engine reads HF_TOKEN for --hf-token).
        done = await http.post(
            "/completion", json={"model": "tiny-a", "prompt": "hi", "n_predict": 2}
        )
        assert done.status_code == 200

        for path in ("/models", "/v1/models"):
            resp = await http.get(path)
            assert TOKEN not in resp.text, path
            [item] = [m for m in resp.json()["data"] if m["id"] == "tiny-a"]
            assert "--hf-token" not in item["status"]["args"]
            assert "hf-token = <redacted>" in item["status"]["preset"]
        show = await http.post("/api/show", json={"model": "tiny-a"})
        assert show.status_code == 200
        assert TOKEN not in show.text
        assert "<redacted>" in show.json()["modelfile"]
