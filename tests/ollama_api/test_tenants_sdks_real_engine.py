"""A tenants file seen by the official clients, with the real engine: the ``openai`` SDK
and the ``ollama`` client list only the models their key may use, meet a model it may not
use as one that does not exist, and get a permission error for an admin action; the
admin's key does all of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import ollama
import openai
import pytest
import trio

from troupe_rig.router import RouterFactory, RunningRouter

pytestmark = pytest.mark.engine

KEYS = {"alice": "k-alice-SECRET", "ops": "k-ops-SECRET"}


@asynccontextmanager
async def tenants_router(
    real_router: RouterFactory, tmp_path: Path
) -> AsyncIterator[RunningRouter]:
    path = tmp_path / "tenants.toml"
    path.write_text(
        '[[tenant]]\nname = "alice"\nkey = "k-alice-SECRET"\nmodels = ["tiny*"]\n\n'
        '[[tenant]]\nname = "ops"\nkey = "k-ops-SECRET"\nadmin = true\n'
    )
    async with real_router("--tenants", str(path)) as router:
        yield router


def _openai_calls(url: str, key: str) -> dict[str, object]:
    """What the SDK makes of a listing, a chat with an allowed, a hidden and an unknown
    model, and a load (troupe's POST /models/load, through the SDK's own client)."""
    out: dict[str, object] = {}
    with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120) as client:
        out["models"] = sorted(m.id for m in client.models.list())
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        out["served"] = chat.usage.completion_tokens if chat.usage else None
        for name in ("gemma", "no-such-model"):
            try:
                client.chat.completions.create(
                    model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            except openai.APIStatusError as exc:
                out[name] = (type(exc).__name__, exc.status_code, exc.message)
    with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120) as root:
        try:
            root.post("/models/load", body={"model": "tiny"}, cast_to=object)
            out["load"] = "ok"
        except openai.APIStatusError as exc:
            out["load"] = (type(exc).__name__, exc.status_code)
    return out


async def test_the_openai_sdk_sees_its_models_and_the_right_errors(
    real_router: RouterFactory, tmp_path: Path
) -> None:
    async with tenants_router(real_router, tmp_path) as router:
        alice = await trio.to_thread.run_sync(_openai_calls, router.url, KEYS["alice"])
        assert alice["models"] == ["tiny", "tiny-embed"]
        assert alice["served"] == 2
        kind, status, message = alice["gemma"]  # type: ignore[misc]
        assert (kind, status) == ("BadRequestError", 400)
        assert message == alice["no-such-model"][2].replace("no-such-model", "gemma")  # type: ignore[index]
        assert alice["load"] == ("PermissionDeniedError", 403)
        ops = await trio.to_thread.run_sync(_openai_calls, router.url, KEYS["ops"])
        assert ops["models"] == ["gemma", "gemma-tools", "tiny", "tiny-embed"]
        assert ops["load"] in ("ok", ("BadRequestError", 400))  # loaded, or already running
        assert "gemma" not in ops  # served


async def test_the_ollama_client_sees_its_models_and_ollamas_errors(
    real_router: RouterFactory, tmp_path: Path
) -> None:
    async with tenants_router(real_router, tmp_path) as router:
        headers = {"Authorization": f"Bearer {KEYS['alice']}"}
        api = ollama.AsyncClient(host=router.url, timeout=120, headers=headers)
        try:
            listed = await api.list()
            assert sorted(m.model or "" for m in listed.models) == [
                "tiny-embed:latest",
                "tiny:latest",
            ]
            answer = await api.generate(model="tiny", prompt="hi", options={"num_predict": 2})
            assert answer.eval_count == 2
            with pytest.raises(ollama.ResponseError) as hidden:
                await api.chat(model="gemma", messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(ollama.ResponseError) as unknown:
                await api.chat(model="nope", messages=[{"role": "user", "content": "hi"}])
            assert hidden.value.status_code == unknown.value.status_code == 404
            assert hidden.value.error == 'model "gemma" not found, try pulling it first'
            running = await api.ps()
            assert [m.model for m in running.models] == ["tiny:latest"]
            with pytest.raises(ollama.ResponseError) as refused:
                await api.delete("tiny")
            assert refused.value.status_code == 403
            with pytest.raises(ollama.ResponseError) as refused:
                await api.pull("org/repo:Q4_K_M")
            assert refused.value.status_code == 403
            assert "SECRET" not in json.dumps(refused.value.error)
        finally:
            await api.close()
