"""Swapping models leaks nothing: connections to a child that exited are closed at once.

Measured before the fix: 46 -> 1,006 open descriptors over 60 swaps with 16 clients: idle
pooled connections to exited children were never dropped. The router runs in this
process, so its descriptors are this process's (the HTTP clients' pool is bounded).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import trio

from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

CLIENTS = 8
SWAPS = 12


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_swaps_with_concurrent_clients_leave_no_descriptor_behind(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--models-dir", str(tiny_model_dir), "--models-max", "1", "-c", "256", "-np", "4"]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "s", cwd=tmp_path) as router,
        router.client(limits=httpx.Limits(max_connections=CLIENTS)) as http,
    ):

        async def burst(model: str) -> None:
            async def one() -> None:
                r = await http.post("/tokenize", json={"model": model, "content": "hello"})
                assert r.status_code == 200, r.text

            async with trio.open_nursery() as nursery:
                for _ in range(CLIENTS):
                    nursery.start_soon(one)

        await burst("tiny-a")
        await burst("tiny-b")  # every connection the test will use now exists
        before = open_fds()
        for i in range(SWAPS):
            await burst("tiny-a" if i % 2 == 0 else "tiny-b")
        after = open_fds()
        # Idle pooled connections only to the child that is still up.
        assert router.ctx.relay.idle_connections <= CLIENTS
    assert after - before <= 4, f"{before} -> {after} descriptors over {SWAPS} swaps"
