"""A node SIGKILLed mid-trace behind real HAProxy (three ``troupe serve`` nodes, the real
engine, `troupe_rig.cluster_sdk`), checked with bench/chaos's own invariants and
checkers: every request of the trace in its `Ledger` (nothing hung, none answered twice
or garbled), the requests in flight on the dead node each a clean error and none other
lost, no orphan of the dead node (`orphans_after_exit`), and on every node that lived
`serving` (``/health`` green, a real completion), `troupe_facts`, `leftovers` and
`resources` (descriptors and RSS back to the baseline taken before the trace). Then the
node comes back and its models return to it.
"""

from __future__ import annotations

import sys
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from chaos import invariants as inv
from chaos.client import ERROR, OK, STREAM_ERROR, TRUNCATED, Client
from chaos.procs import TAG_VAR, Tracker, wait_gone
from chaos.routers import TROUPE, Launch, Router
from troupe_rig.cluster import ClusterStack, Node
from troupe_rig.cluster_sdk import NAMES, chat, cluster, stream_until_cut, write_catalogs

BOUND = 60.0  # seconds any one request may take before it counts as hung
TRACE = 8  # requests per model after the kill


@pytest.fixture
def catalogs(tmp_path: Path) -> list[Path]:
    return write_catalogs(tmp_path)


class NodeRouter(Router):
    """A cluster node as bench/chaos's checks see a router: its pid, its start's tag
    (its children carry it), a tracker of its descendants, a client straight to it."""

    def __init__(self, node: Node, workdir: Path, own: dict[str, str]) -> None:
        assert node.process is not None
        here = Path(sys.executable)
        super().__init__(TROUPE, Launch(), engine=here, mixed=here, workdir=workdir, tag=node.tag)
        self.node = node
        self.own = own  # a signed forward mark: the node's own answer, not the cluster's
        self._pid = node.process.process.pid
        self.url = node.url
        self.client = Client(node.url)
        self.tracker = Tracker(0.05)  # its children live for seconds: no need for 10 ms
        self.tracker.start(self._pid)

    @property
    def pid(self) -> int:
        return self._pid

    async def models(self, bound: float = 10.0) -> dict[str, dict[str, Any]]:
        """The node's own list (the forward mark), not the cluster's union."""
        got = await self.client.call(
            "GET", "/models", bound=bound, headers=self.own, watch_after=False
        )
        return {m["id"]: m for m in got.json()["data"]}


async def test_a_node_killed_mid_trace_costs_only_its_requests_and_its_models_come_back(
    tmp_path: Path, catalogs: list[Path], haproxy_path: Path
) -> None:
    async with cluster(tmp_path, catalogs, haproxy_path, tag_var=TAG_VAR) as stack:
        routers = [NodeRouter(n, tmp_path, stack.own_headers()) for n in stack.nodes]
        try:
            await _kill_mid_trace(stack, routers)
        finally:
            for router in routers:
                router.tracker.stop()


async def _kill_mid_trace(stack: ClusterStack, routers: list[NodeRouter]) -> None:
    victim, successor = stack.order("tiny-b")[:2]
    dead = next(r for r in routers if r.node is victim)
    survivors = [r for r in routers if r is not dead]
    # Warm-up (as bench/chaos's): each model served once on its home through the
    # balancer, and once straight from each node (which so learns its peers: their
    # connections are part of its rest); then the nodes that will live unload
    # everything and are measured at rest.
    for model in NAMES:
        node, text = await trio.to_thread.run_sync(chat, stack.url, model)
        assert (node, bool(text)) == (stack.order(model)[0].name, True)
    for router in survivors:
        assert await inv.serving(router, _model_of(stack, router), bound=30) == []
        assert await router.unload_all(30) == []
    bases = {r.node.name: inv.baseline(r) for r in survivors}
    children = [m["troupe"]["pid"] for m in (await dead.models()).values() if m["troupe"]["pid"]]
    assert children  # tiny-b's

    balancer = Client(stack.url)
    ledger = inv.Ledger()
    long = {"model": "tiny-b", "prompt": "hi", "max_tokens": 30000, "ignore_eos": True}
    others = [m for m in NAMES if stack.order(m)[0] is not victim]
    first, streaming = trio.Event(), trio.Event()
    sdk: list[BaseException | None] = []

    async def call(group: str, payload: dict[str, Any], **kw: Any) -> None:
        answer = await balancer.call("POST", "/v1/completions", payload, bound=BOUND, **kw)
        ledger.add(group, answer, str(payload["model"]))

    async def trace(model: str) -> None:
        for _ in range(TRACE):
            await call("trace", {"model": model, "prompt": "hello", "max_tokens": 4})

    async def sdk_stream() -> None:
        sdk.append(await trio.to_thread.run_sync(stream_until_cut, stack.url, "tiny-b", first))

    with trio.fail_after(BOUND + 30):  # nothing hangs
        async with trio.open_nursery() as nursery:
            # In flight on tiny-b's home when it dies: the SDK's stream, a raw stream and
            # a whole (not streamed) answer.
            nursery.start_soon(sdk_stream)
            stream = {**long, "stream": True}
            nursery.start_soon(partial(call, "in flight, streamed", stream, started=streaming))
            nursery.start_soon(call, "in flight, whole", long)
            await first.wait()
            await streaming.wait()
            await _until_in_flight(dead, "tiny-b", 3)
            await stack.kill(victim)
            # Then a trace of every model: the others' on their homes, tiny-b's on the
            # next node (a refused connection is retried there: retry-on conn-failure).
            for model in [*others, "tiny-b"]:
                nursery.start_soon(trace, model)

    # Every request answered once, none hung; the dead node's each a clean error (the
    # balancer's 502 for a whole answer, a cut stream), and nothing else lost.
    assert ledger.never() == []
    assert len(ledger.group("in flight, streamed")) == 1
    assert ledger.violations("in flight, streamed", [TRUNCATED, STREAM_ERROR]) == []
    assert [a.status for a in ledger.group("in flight, whole")] == [502]
    assert ledger.violations("in flight, whole", [ERROR]) == []
    assert len(sdk) == 1
    assert sdk[0] is not None  # the SDK's stream ended with an error, not normally
    assert ledger.violations("trace", [OK]) == []
    assert ledger.count("trace") == Counter({OK: TRACE * (len(others) + 1)})

    # Its models stay on the next node once the health check has taken it out.
    await stack.wait_status(victim.name, "DOWN")
    # (The next node in its order, or a node where the agent check says tiny-b is already
    # warm from the trace: a warm copy is preferred to a cold load.)
    warm = [r.node.name for r in survivors if r.node.name in await stack.loaded_on("tiny-b")]
    node, text = await trio.to_thread.run_sync(chat, stack.url, "tiny-b")
    assert (node in {successor.name, *warm}, bool(text)) == (True, True), (node, warm)
    # Its own routes through the balancer say it is down, never another node's answer.
    asked = await balancer.call("GET", f"/metrics?node={victim.name}", bound=10)
    assert (asked.status, asked.json()["error"]["type"]) == (503, "unavailable_error")

    # No orphan: the dead node's children exit (each stops at stdin EOF), and nothing
    # that carries its start's tag is left.
    for pid in children:
        assert await wait_gone(pid, 30)
    assert inv.orphans_after_exit(dead) == []

    # The nodes that lived: serving, nothing in flight, nothing left over, their
    # descriptors and RSS back to the baseline.
    for router in survivors:
        assert await inv.serving(router, _model_of(stack, router), bound=30) == []
        assert await router.unload_all(30) == []
        assert inv.troupe_facts(await router.models()) == []
        assert inv.leftovers(router) == []
        base = bases[router.node.name]
        fds = await inv.settle_fds(router, base, within=30)  # returns once settled
        assert inv.resources(base, fds, router.rss()) == []

    # The node comes back on its port: once its health check passes, its models
    # return to it.
    await stack.start(victim)
    await stack.wait_status(victim.name, "UP")
    node, text = await trio.to_thread.run_sync(chat, stack.url, "tiny-b")
    assert (node, bool(text)) == (victim.name, True)
    assert victim.name in await stack.loaded_on("tiny-b")


def _model_of(stack: ClusterStack, router: NodeRouter) -> str:
    """A model the node serves itself: one it is home to, else one of its catalog."""
    homes = [m for m in NAMES if stack.order(m)[0] is router.node]
    return homes[0] if homes else stack.models_of(router.node)[0]


async def _until_in_flight(router: NodeRouter, model: str, count: int) -> None:
    """Until the node has ``count`` requests for ``model`` in flight (its own /models:
    no event says so from outside)."""
    with trio.fail_after(30):
        while (await router.models())[model]["troupe"]["in_flight"] < count:  # noqa: ASYNC110
            await trio.sleep(0.02)
