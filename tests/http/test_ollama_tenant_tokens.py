"""Ollama's /api/generate and /api/chat count the engine's own tokens for their tenant,
like the OpenAI routes: the release charges the tenant's attained service (fair
queuing) with the answer's ``prompt_eval_count + eval_count``, the budget is settled from
them, and ``GET /troupe/usage`` and the per-tenant metrics show them (real engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from troupe.tenants.model import Limits, Tenant, Tenants
from troupe_rig import write_tiny_models
from troupe_rig.router import RunningRouter, open_router

MODEL = "m-ollama-tokens"
KEYS = {"alice": "k-alice", "root": "k-root"}
BOOK = Tenants(
    (
        Tenant("alice", KEYS["alice"], admin=False, limits=Limits(tokens_per_day=100_000)),
        Tenant("root", KEYS["root"]),
    ),
    from_file=True,
)


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


async def attained(router: RunningRouter, tenant: str) -> float:
    """The tenant's attained service in the scheduler's core, once the last answer's
    release is in: a streamed answer's client reads its last line before the handler's
    release reaches the scheduler (the charge and the lease's end are one message)."""
    await router.ctx.scheduler.wait_until(lambda s: s.models[MODEL].in_flight == 0)
    core = router.ctx.scheduler._core
    return core.fair.attained(tenant, trio.current_time())


async def ask(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One answer of alice's (the last NDJSON line of a stream): its counts."""
    answer = await http.post(path, json={"model": MODEL, **body}, headers=auth("alice"))
    assert answer.status_code == 200, answer.text
    last: dict[str, Any] = json.loads(answer.text.strip().splitlines()[-1])
    assert last["done"]
    assert last["prompt_eval_count"] > 0
    assert last["eval_count"] > 0
    return last


async def test_ollama_answers_charge_their_tenant_the_engines_tokens(
    engine_path: Path, tmp_path: Path
) -> None:
    write_tiny_models(tmp_path / "models", [MODEL])
    async with open_router(
        ["--models-dir", str(tmp_path / "models"), "--ctx-size", "512"],
        engine=engine_path,
        state_dir=tmp_path / "state",
    ) as router:
        router.ctx.tenants.replace(BOOK)
        async with router.client(timeout=120) as http:
            options = {"num_predict": 6, "temperature": 0}
            generated = await ask(
                http, "/api/generate", {"prompt": "hello", "stream": False, "options": options}
            )
            spent = generated["prompt_eval_count"] + generated["eval_count"]
            # The release was charged the answer's own count (not a typical answer's).
            assert await attained(router, "alice") == pytest.approx(spent, rel=0.02)
            messages = [{"role": "user", "content": "hi there"}]
            chatted = await ask(
                http, "/api/chat", {"messages": messages, "stream": True, "options": options}
            )
            spent += chatted["prompt_eval_count"] + chatted["eval_count"]
            assert await attained(router, "alice") == pytest.approx(spent, rel=0.02)

            usage = (await http.get("/troupe/usage", headers=auth("alice"))).json()
            (total,) = usage["totals"]
            assert (total["tenant"], total["requests"]) == ("alice", 2)
            assert total["total_tokens"] == spent
            (budget,) = usage["budgets"]
            assert budget["tokens_per_day"]["remaining"] == 100_000 - spent

            text = (await http.get("/metrics", headers=auth("root"))).text
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        tokens = sum(
            samples[("troupe_tenant_tokens_total", (("direction", d), ("tenant", "alice")))]
            for d in ("in", "out")
        )
        assert tokens == spent
