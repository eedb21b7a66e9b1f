"""Faults the real engine will not produce on demand, through the Ollama API: a child
that dies mid-answer (the fake engine's ``crash-after``). The client talking is the
official ``ollama`` client; the fake engine only injects the fault."""

from __future__ import annotations

import ollama
import pytest
import trio

from troupe_rig.router import RouterFactory


async def test_a_child_that_dies_mid_stream_ends_it_with_ollamas_error_line(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-crash-after": "3"}}) as router:
        api = ollama.AsyncClient(host=router.url, timeout=60)
        try:
            parts: list[ollama.ChatResponse] = []

            async def read() -> None:
                stream = await api.chat(
                    model="a", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                async for part in stream:
                    parts.append(part)  # kept as they come, until the error

            with pytest.raises(ollama.ResponseError) as err:
                await read()
            assert "closed the connection" in err.value.error
            assert parts  # some pieces came first
            assert all(not p.done for p in parts)  # never a last object: the answer is cut
            with pytest.raises(ollama.ResponseError) as whole:
                await api.chat(model="a", messages=[{"role": "user", "content": "hi"}])
            assert whole.value.status_code == 500
            with trio.fail_after(10):  # both leases given back
                await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)
        finally:
            await api.close()
