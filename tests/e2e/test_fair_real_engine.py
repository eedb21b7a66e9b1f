"""Fair queuing across tenants with the real llama-server, over real sockets.

The child serves one request at a time (``--parallel 1``). One tenant floods it; a
second tenant's request, sent while the flood's requests wait in the core, is served
next (it has had no service; the flooder has), before the flood's queued requests.
A ``/tokenize`` meanwhile never waits behind the flood: it takes no slot.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio

from troupe.sched import Snapshot
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

FLOOD = 8
CHILD_ARGS = ("--ctx-size", "512", "--parallel", "1")


def queued(model: str, at_least: int) -> Callable[[Snapshot], bool]:
    def check(snap: Snapshot) -> bool:
        return any(m == model and n >= at_least for m, n in snap.queue)

    return check


async def test_an_interactive_tenant_goes_before_a_floods_queued_requests(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("batch:k-batch\nui:k-ui\n")
    batch = {"Authorization": "Bearer k-batch"}
    ui = {"Authorization": "Bearer k-ui"}
    args = ["--models-dir", str(tiny_model_dir), "--named-api-keys", str(keys), *CHILD_ARGS]
    order: list[str] = []
    body = {"model": "tiny-a", "prompt": "count", "max_tokens": 200, "ignore_eos": True}
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "state", cwd=tmp_path) as r,
        r.client(timeout=120) as http,
    ):
        warm = await http.post("/v1/completions", json={**body, "max_tokens": 1}, headers=ui)
        assert warm.status_code == 200, warm.text

        async def ask(who: str, headers: dict[str, str]) -> None:
            if who == "ui":
                arrived.append(len(order))  # the flood's answers ended before ui asked
            answer = await http.post("/v1/completions", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            order.append(who)

        arrived: list[int] = []
        async with trio.open_nursery() as nursery:
            for i in range(FLOOD):
                nursery.start_soon(ask, f"batch-{i}", batch)
            # The child has one slot: the flood's other requests wait in troupe's core.
            with trio.fail_after(60):
                await r.ctx.scheduler.wait_until(queued("tiny-a", FLOOD - 3))
            nursery.start_soon(ask, "ui", ui)
            # A /tokenize meanwhile takes no slot: answered while the flood still waits.
            tokens = await http.post(
                "/tokenize", json={"model": "tiny-a", "content": "hello"}, headers=batch
            )
            assert tokens.status_code == 200, tokens.text
            assert queued("tiny-a", 1)(r.ctx.scheduler.snapshot), "tokenize waited"
    assert sorted(order) == sorted([*(f"batch-{i}" for i in range(FLOOD)), "ui"])
    # When ui asked, most of the flood still waited (it asked as soon as 5 did) ...
    done_before = arrived[0]
    assert done_before <= FLOOD - 4, order
    # ... and at most the flood's requests already granted then (one in the slot, and
    # one granted as it arrived) end before ui; the rest of the flood waited behind it.
    before = order.index("ui")
    assert before - done_before <= 2, (done_before, order)


async def test_max_parallel_is_held_by_a_tenant_file(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A tenant with ``max_parallel = 1`` never has two requests at the child at once,
    whatever it sends; the child's other slot goes to another tenant meanwhile."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        '[[tenant]]\nname = "capped"\nkey = "k-capped"\nmax_parallel = 1\n\n'
        '[[tenant]]\nname = "free"\nkey = "k-free"\n'
    )
    args = [
        "--models-dir", str(tiny_model_dir), "--tenants", str(tenants),
        "--ctx-size", "512", "--parallel", "2",
    ]  # fmt: skip
    body = {"model": "tiny-a", "prompt": "count", "max_tokens": 100, "ignore_eos": True}
    most = 0
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "state", cwd=tmp_path) as r,
        r.client(timeout=120) as http,
    ):
        core = r.ctx.scheduler._core  # read between awaits: the actor's own state

        def capped_in_flight() -> int:
            leases = core.requests.leases.values()
            return sum(1 for lease in leases if lease.tenant == "capped" and lease.slot)

        async def ask(key: str) -> httpx.Response:
            nonlocal most
            answer = await http.post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            most = max(most, capped_in_flight())
            assert answer.status_code == 200, answer.text
            return answer

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(ask, "k-capped")
            # Once the model is loaded: one of capped's requests at the child, the other
            # three waiting for it (while the model loads, all four wait).
            waiting = queued("tiny-a", 3)
            with trio.fail_after(60):
                await r.ctx.scheduler.wait_until(
                    lambda snap: waiting(snap) and capped_in_flight() >= 1
                )
            assert capped_in_flight() == 1
            await ask("k-free")  # the second slot is free to another tenant
            assert capped_in_flight() <= 1
    assert most <= 1
