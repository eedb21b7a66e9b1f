"""A node's death spreads its models over the others, and HAProxy's own errors are JSON.

Three ``troupe serve`` nodes with the real engine behind real HAProxy (Debian's 2.6),
each able to hold all six tiny models (``--models-max 2``): bounded homes make every
node home to two. The official ``openai`` SDK talks to the balancer throughout.

Before, all of a dead node's models had the same second choice (the plain rendezvous
order after the home): one survivor took them all and swapped while another took none.
Now the models homed on one node have their second node spread over the others, so the
dead node's two models go to two different survivors. The request that was in flight
on the dead node gets HAProxy's 502 in llama.cpp's JSON error shape (before: HAProxy's
HTML page), which the SDK reads as it reads any server's error.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.cluster import ClusterStack, Node, open_cluster
from troupe_rig.cluster_sdk import CTX, chat, client

MODELS = [f"tiny-{c}" for c in "abcdef"]
BOUND = 60.0  # seconds: far past a health check's two failures (300 ms each)


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    write_tiny_models(
        tmp_path / "models", [TinyModel(m, seed=i, n_ctx=CTX) for i, m in enumerate(MODELS)]
    )
    return tmp_path / "models"


def _long_whole(url: str, model: str) -> BaseException | None:
    """A long completion, not streamed: what ended it (None: it was answered)."""
    with client(url) as sdk:
        try:
            sdk.completions.create(
                model=model, prompt="hi", max_tokens=30000, extra_body={"ignore_eos": True}
            )
        except openai.APIError as exc:
            return exc
    return None


async def _in_flight(stack: ClusterStack, node: Node, model: str) -> None:
    # The node's own /models says so; no event reaches the test from inside it.
    with trio.move_on_after(BOUND):
        while (await stack.own_models(node))[model]["troupe"].get("in_flight", 0) < 1:  # noqa: ASYNC110
            await trio.sleep(0.05)
        return
    where = {n.name: (await stack.own_models(n)).get(model, {}) for n in stack.nodes}
    raise AssertionError(f"{model} never in flight on {node.name}: {where}")


async def test_a_dead_nodes_models_go_to_different_survivors_and_errors_are_json(
    tmp_path: Path, catalog: Path, haproxy_path: Path
) -> None:
    args = ["--models-max", "2", "--ctx-size", str(CTX)]
    async with open_cluster(
        tmp_path / "cluster", [catalog] * 3, args, haproxy=haproxy_path
    ) as stack:
        victim = stack.nodes[0]
        mine = [m for m in MODELS if stack.order(m)[0] is victim]
        assert len(mine) == 2  # bounded homes: two each
        seconds = [stack.order(m)[1] for m in mine]
        assert seconds[0] is not seconds[1]  # spread (placement: bounded second choices)

        # A mark a client sends through the balancer is dropped there: each model still
        # goes to its home (the balancer's own mark is set instead).
        forged = {"x-troupe-forwarded": "n1"}
        for model in mine:
            node, text = await trio.to_thread.run_sync(
                partial(chat, stack.url, model, extra_headers=forged)
            )
            assert (node, bool(text)) == (victim.name, True)

        # One long answer in flight on the victim when it is SIGKILLed.
        ended: list[BaseException | None] = []

        async def whole() -> None:
            ended.append(
                await trio.to_thread.run_sync(
                    _long_whole, stack.url, mine[0], abandon_on_cancel=True
                )
            )

        with trio.fail_after(2 * BOUND):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(whole)
                await _in_flight(stack, victim, mine[0])
                await stack.kill(victim)
        error = ended[0]
        assert isinstance(error, openai.APIStatusError), error
        assert error.status_code == 502
        assert error.response.headers["content-type"].startswith("application/json")
        body: Any = error.response.json()
        assert body["error"]["type"] == "unavailable_error", body
        assert body["error"]["code"] == 502

        # Out of the balancer after its failed checks: each of its models is served by
        # its own second node, two different survivors.
        await stack.wait_status(victim.name, "DOWN", within=BOUND)
        served = []
        for model, second in zip(mine, seconds, strict=True):
            with trio.fail_after(BOUND):
                node, text = await trio.to_thread.run_sync(chat, stack.url, model)
            assert (node, bool(text)) == (second.name, True)
            served.append(node)
        assert len(set(served)) == 2
        for model, second in zip(mine, seconds, strict=True):
            assert await stack.loaded_on(model) == [second.name]
