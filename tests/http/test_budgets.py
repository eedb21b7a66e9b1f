"""Tenants' rate limits and token budgets over real sockets with the real engine: 50
concurrent requests of one tenant never spend beyond its budget, a refusal is a 429 with
Retry-After and OpenAI's x-ratelimit-* headers (the official SDK retries it by itself;
Ollama's client gets Ollama's error shape), ``GET /troupe/usage`` and ``troupe usage``
count what the engine's own ``usage`` said, and the counters survive a restart."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from troupe.commands.usage import run_usage
from troupe.tenants.model import Limits, Tenant, Tenants
from troupe_rig import write_tiny_models
from troupe_rig.router import RunningRouter, open_router

MODEL = "m-budget"
KEYS = {"alice": "k-alice", "bob": "k-bob", "carol": "k-carol", "root": "k-root"}
ALICE = Limits(requests_per_minute=1000, tokens_per_minute=100_000, tokens_per_day=300)
BOOK = Tenants(
    (
        Tenant("alice", KEYS["alice"], admin=False, limits=ALICE),
        Tenant("bob", KEYS["bob"], admin=False, limits=Limits(requests_per_minute=30)),
        Tenant("carol", KEYS["carol"], admin=False, limits=Limits(requests_per_minute=1)),
        Tenant("root", KEYS["root"]),
    ),
    from_file=True,
)
OPENAI_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


@asynccontextmanager
async def budget_router(engine_path: Path, tmp_path: Path) -> AsyncIterator[RunningRouter]:
    """The router with the tiny model and `BOOK` (state kept in ``tmp_path/state``)."""
    models = tmp_path / "models"
    if not models.exists():
        write_tiny_models(models, [MODEL])
    async with open_router(
        ["--models-dir", str(models), "--ctx-size", "512"],
        engine=engine_path,
        state_dir=tmp_path / "state",
    ) as router:
        router.ctx.tenants.replace(BOOK)
        yield router


async def completion(http: httpx.AsyncClient, tenant: str, max_tokens: int = 8) -> httpx.Response:
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": max_tokens, "temperature": 0}
    return await http.post("/v1/completions", json=body, headers=auth(tenant))


def used(answer: httpx.Response) -> int:
    usage = answer.json()["usage"]
    return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])


async def test_fifty_concurrent_requests_never_spend_beyond_the_budget(
    engine_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with budget_router(engine_path, tmp_path) as router, router.client() as http:
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await completion(http, "alice"))

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(ask)
        ok = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 429]
        assert len(ok) + len(refused) == 50
        assert ok
        assert refused
        spent = sum(used(a) for a in ok)
        assert spent <= ALICE.tokens_per_day  # tokens admitted beyond the budget: 0
        for answer in ok:  # a limited tenant's answers carry its limits
            assert all(name in answer.headers for name in OPENAI_HEADERS)
            assert answer.headers["x-ratelimit-limit-tokens"] == "100000"
        for answer in refused:
            error = answer.json()["error"]
            assert set(error) >= {"message", "type", "code"}
            assert (error["type"], error["code"]) in (
                ("insufficient_quota", "insufficient_quota"),  # the day is spent
                ("tokens", "rate_limit_exceeded"),  # reserved by requests in flight
            )
            assert int(answer.headers["retry-after"]) >= 1
            assert all(name in answer.headers for name in OPENAI_HEADERS)
        # Spent: the day's budget, refused until UTC midnight, and the SDK told not to retry.
        last = await completion(http, "alice", max_tokens=200)
        assert last.status_code == 429
        assert last.json()["error"]["code"] == "insufficient_quota"
        assert last.headers["x-should-retry"] == "false"
        assert 1 <= int(last.headers["retry-after"]) <= 86_400

        # /troupe/usage: alice's totals are the engine's own usage, summed.
        mine = (await http.get("/troupe/usage", headers=auth("alice"))).json()
        (total,) = mine["totals"]
        assert total["tenant"] == "alice"
        assert total["total_tokens"] == spent
        assert total["requests"] == len(ok)
        assert sum(total["rejected"].values()) == len(refused) + 1
        assert {row["tenant"] for row in mine["data"]} == {"alice"}
        (budget,) = mine["budgets"]
        assert budget["tokens_per_day"]["limit"] == 300
        assert budget["tokens_per_day"]["remaining"] == 300 - spent
        # A tenant that is not admin sees only its own; an admin of the file, everyone's.
        assert (await http.get("/troupe/usage", headers=auth("bob"))).json()["data"] == []
        everyone = (await http.get("/troupe/usage", headers=auth("root"))).json()
        assert [t["tenant"] for t in everyone["totals"]] == ["alice"]
        assert (await http.get("/troupe/usage")).status_code == 401

        # /metrics: per-tenant families, read by Prometheus' own parser.
        text = (await http.get("/metrics", headers=auth("root"))).text
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        tokens_in = samples[
            ("troupe_tenant_tokens_total", (("direction", "in"), ("tenant", "alice")))
        ]
        tokens_out = samples[
            ("troupe_tenant_tokens_total", (("direction", "out"), ("tenant", "alice")))
        ]
        assert tokens_in + tokens_out == spent
        rejected = sum(
            v for (name, labels), v in samples.items()
            if name == "troupe_tenant_rejected_total" and ("tenant", "alice") in labels
        )  # fmt: skip
        assert rejected == len(refused) + 1
        assert samples[("troupe_tenant_queue_wait_seconds_count", (("tenant", "alice"),))] == len(
            ok
        )

        # troupe usage: the same figures, as a table and as JSON.
        args = ["--url", router.url, "--api-key", KEYS["alice"]]
        assert await trio.to_thread.run_sync(run_usage, args) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split() == [
            "TENANT", "DAY", "MODEL", "REQUESTS", "PROMPT", "GENERATED", "TOTAL", "REJECTED",
        ]  # fmt: skip
        totals_line = next(line for line in table if line.split()[:2] == ["alice", "total"])
        assert str(spent) in totals_line.split()
        assert await trio.to_thread.run_sync(run_usage, [*args, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["totals"] == mine["totals"]


async def test_counters_survive_a_restart(engine_path: Path, tmp_path: Path) -> None:
    async with budget_router(engine_path, tmp_path) as router, router.client() as http:
        answer = await completion(http, "alice")
        assert answer.status_code == 200
        spent = used(answer)
        before = (await http.get("/troupe/usage", headers=auth("alice"))).json()
    assert (tmp_path / "state" / "usage.json").exists()
    async with budget_router(engine_path, tmp_path) as router, router.client() as http:
        after = (await http.get("/troupe/usage", headers=auth("alice"))).json()
        assert after["totals"] == before["totals"]
        assert after["totals"][0]["total_tokens"] == spent
        assert after["budgets"][0]["tokens_per_day"]["remaining"] == 300 - spent


def _sdk_completion(url: str, max_tokens: int, tenant: str = "bob") -> tuple[int, str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS[tenant], max_retries=2)
    try:
        done = client.completions.create(model=MODEL, prompt="hi", max_tokens=max_tokens)
        return 200, done.choices[0].text
    except openai.RateLimitError as exc:
        return exc.status_code, str(exc)
    finally:
        client.close()


async def test_the_openai_sdk_retries_a_429_by_itself(engine_path: Path, tmp_path: Path) -> None:
    async with budget_router(engine_path, tmp_path) as router, router.client() as http:
        accounts = router.ctx.accounts
        # Bob's 30 requests a minute, spent at one instant (the accountant's clock held),
        # so his bucket is exactly empty when the clock runs again.
        frozen = time.time()
        accounts.clock = lambda: frozen
        tokenize = {"model": MODEL, "content": "x"}
        for _ in range(30):
            assert (await http.post("/tokenize", json=tokenize, headers=auth("bob"))).is_success
        refused = await http.post("/tokenize", json=tokenize, headers=auth("bob"))
        assert refused.status_code == 429
        assert (refused.json()["error"]["type"], refused.json()["error"]["code"]) == (
            "requests", "rate_limit_exceeded",
        )  # fmt: skip
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert (refused.headers["retry-after"], refused.headers["retry-after-ms"]) == ("2", "2000")
        started = time.time()
        accounts.clock = lambda: frozen + (time.time() - started)
        # The SDK gets a 429, waits Retry-After (one request's refill: two seconds), retries.
        status, _text = await trio.to_thread.run_sync(_sdk_completion, router.url, 2)
        assert status == 200
        mine = [r for r in router.ctx.requests.recent(tenant="bob") if r.path == "/v1/completions"]
        assert [r.status for r in reversed(mine)] == [429, 200]
        # More than a minute's tokens: the SDK is told not to retry (one request, one 429).
        status, text = await trio.to_thread.run_sync(_sdk_completion, router.url, 10**6, "alice")
        assert status == 429
        assert "Request too large" in text
        theirs = [r.status for r in router.ctx.requests.recent(tenant="alice")]
        assert theirs == [429]


async def test_the_ollama_client_gets_ollamas_error_shape(
    engine_path: Path, tmp_path: Path
) -> None:
    async with budget_router(engine_path, tmp_path) as router:
        api = ollama.AsyncClient(host=router.url, headers=auth("carol"), timeout=120)
        try:
            first = await api.generate(model=MODEL, prompt="hi", options={"num_predict": 2})
            assert first.done
            with pytest.raises(ollama.ResponseError) as refused:
                await api.generate(model=MODEL, prompt="hi", options={"num_predict": 2})
        finally:
            await api._client.aclose()
        assert refused.value.status_code == 429
        assert "requests per min" in refused.value.error
        async with router.client() as http:
            raw = await http.post(
                "/api/generate",
                json={"model": MODEL, "prompt": "hi", "stream": False},
                headers=auth("carol"),
            )
        assert raw.status_code == 429
        body: dict[str, Any] = raw.json()
        assert list(body) == ["error"]
        assert isinstance(body["error"], str)
        assert int(raw.headers["retry-after"]) >= 1
        assert raw.headers["x-ratelimit-limit-requests"] == "1"
