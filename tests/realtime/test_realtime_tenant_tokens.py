"""A realtime session's responses count the engine's own tokens for their tenant, like
the OpenAI routes: each response's release charges the tenant's attained service (fair
queuing) with its ``usage``, its budget is settled from it, and the session's record
reaches the usage ledger and the per-tenant metrics (real engine, the openai SDK)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from troupe.tenants.model import Limits, Tenant, Tenants
from troupe_rig.realtime_client import EventLog, run_asyncio, sdk_client
from troupe_rig.router import RouterFactory

pytestmark = pytest.mark.engine

KEYS = {"alice": "k-alice", "root": "k-root"}
BOOK = Tenants(
    (
        Tenant("alice", KEYS["alice"], admin=False, limits=Limits(tokens_per_day=100_000)),
        Tenant("root", KEYS["root"]),
    ),
    from_file=True,
)


def user(text: str) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


async def test_realtime_responses_charge_their_tenant_the_engines_tokens(
    real_router: RouterFactory,
) -> None:
    async def scenario(url: str) -> list[int]:
        async with sdk_client(url, api_key=KEYS["alice"]).realtime.connect(model="tiny") as conn:
            log = EventLog(conn)
            assert (await log.next()).type == "session.created"
            totals = []
            for text in ("hello", "tell me more"):
                await log.send(user(text))
                await log.until("conversation.item.done")
                await log.send({"type": "response.create", "response": {"max_output_tokens": 6}})
                done = (await log.until("response.done"))[-1].response
                assert done.status == "incomplete"  # (max_output_tokens)
                totals.append(done.usage.total_tokens)
            return totals

    async with real_router() as router:
        router.ctx.tenants.replace(BOOK)
        totals = await run_asyncio(scenario, router.url)
        spent = sum(totals)
        assert spent > 0
        with trio.fail_after(10):
            await router.ctx.requests.wait_until(lambda r: r.kind == "realtime")
        # Each response's release was charged its own usage (not a typical answer's).
        fair = router.ctx.scheduler._core.fair
        assert fair.attained("alice", trio.current_time()) == pytest.approx(spent, rel=0.02)
        async with router.client(timeout=60) as http:
            usage = await http.get("/troupe/usage", headers={"Authorization": "Bearer k-alice"})
            (total,) = usage.json()["totals"]
            assert (total["tenant"], total["total_tokens"]) == ("alice", spent)
            (budget,) = usage.json()["budgets"]
            assert budget["tokens_per_day"]["remaining"] == 100_000 - spent
            text = (await http.get("/metrics", headers={"Authorization": "Bearer k-root"})).text
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
