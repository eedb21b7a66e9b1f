"""Scale-out: one troupe node against three behind HAProxy, on the same trace.

Six tiny GGUF models, the real engine with its default flags (troupe places each child
on CPUs of its own), ``--models-max 2`` on every node. The same seeded trace of chat
completions (skewed popularity, six models) is sent by concurrent clients to:

* **one node**: troupe alone, six models through two slots (swaps);
* **three nodes** behind HAProxy, configured by ``troupe cluster render``: each model
  on its home node (two each), six slots in all.

For each: the loads (``troupe_model_loads_total`` summed over the nodes), total time,
p50/p99 latency. Then what the balancer adds to a request: the same warm model's
``POST /tokenize``, one client at a time, to a node directly and through HAProxy;
and what a forward costs: a 200 KB chat (its ``model`` after the messages, past
HAProxy's buffer), sent to the model's home directly and to another node (which
forwards it once).

All three nodes run on this one machine, so they share its cores (on a 2-core machine
the three-node figures are a lower bound of what three machines give).

    .venv/bin/python bench/cluster.py [--requests N] [--clients N] [--probes N]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

from _util import percentile
from cluster_kv import failover_case
from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.cluster import ClusterStack, Node, open_cluster
from troupe_rig.process import start_troupe

MODELS = [TinyModel(name=f"m-{c}", seed=i) for i, c in enumerate("abcdef")]
WEIGHTS = (0.30, 0.25, 0.18, 0.12, 0.10, 0.05)
NODE_ARGS = ["--models-max", "2"]
LONG = 200_000
_LOADS = re.compile(r'^troupe_model_loads_total\{[^}]*result="loaded"[^}]*\} (\S+)$', re.M)


def trace(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return rng.choices([m.name for m in MODELS], WEIGHTS, k=n)


async def loads(urls: list[str]) -> int:
    total = 0.0
    async with httpx.AsyncClient(timeout=30) as http:
        for url in urls:
            text = (await http.get(url + "/metrics")).text
            total += sum(float(v) for v in _LOADS.findall(text))
    return int(total)


async def run_trace(url: str, models: list[str], clients: int) -> tuple[float, list[float]]:
    """Total seconds and each request's latency (s); every answer must be a 200."""
    latencies: list[float] = []

    async def client(i: int, http: httpx.AsyncClient) -> None:
        for model in models[i::clients]:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 8,
            }
            start = time.perf_counter()
            resp = await http.post("/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - start)
            if resp.status_code != 200:
                raise RuntimeError(f"{model}: {resp.status_code} {resp.text[:200]}")

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(client, i, http)
        return time.perf_counter() - start, sorted(latencies)


async def probe(urls: list[str], n: int, body: bytes, path: str) -> list[float]:
    """``n`` rounds of one request to each of ``urls`` in turn (so the machine's drift
    falls on all alike), each on its own keep-alive connection: each URL's median (ms)."""
    out: list[list[float]] = [[] for _ in urls]
    headers = {"content-type": "application/json"}
    clients = [httpx.AsyncClient(base_url=u, timeout=60) for u in urls]
    try:
        for i in range(n + 5):
            for lat, http in zip(out, clients, strict=True):
                start = time.perf_counter()
                resp = await http.post(path, content=body, headers=headers)
                if i >= 5:  # the first few warm the connections
                    lat.append(time.perf_counter() - start)
                if resp.status_code >= 500:
                    raise RuntimeError(f"{path}: {resp.status_code} {resp.text[:200]}")
    finally:
        for http in clients:
            await http.aclose()
    return [statistics.median(lat) * 1e3 for lat in out]


def line(label: str, total: float, lat: list[float], n_loads: int) -> str:
    p50, p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
    return (
        f"  {label:<26} loads {n_loads:>4}  total {total:7.2f} s  "
        f"p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
    )


async def one_node(models_dir: Path, work: Path, order: list[str], clients: int) -> str:
    proc = await start_troupe([*NODE_ARGS, "--models-dir", str(models_dir)], state_dir=work)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.drain_log)
        try:
            total, lat = await run_trace(proc.url, order, clients)
            return line("one node", total, lat, await loads([proc.url]))
        finally:
            proc.process.terminate()
            with trio.move_on_after(30):
                await proc.process.wait()
            nursery.cancel_scope.cancel()


async def three_nodes(
    models_dir: Path, work: Path, order: list[str], clients: int, probes: int
) -> list[str]:
    out = []
    async with open_cluster(work, [models_dir] * 3, NODE_ARGS) as stack:
        total, lat = await run_trace(stack.url, order, clients)
        urls = [n.url for n in stack.nodes]
        out.append(line("three nodes + HAProxy", total, lat, await loads(urls)))
        homes = {m.name: stack.order(m.name)[0].name for m in MODELS}
        out.append("  homes: " + ", ".join(f"{m} {n}" for m, n in sorted(homes.items())))
        out += await overheads(stack, probes)
    return out


async def overheads(stack: ClusterStack, probes: int) -> list[str]:
    model = MODELS[0].name
    home: Node = stack.order(model)[0]
    other: Node = stack.order(model)[1]
    small = b'{"model": "%s", "content": "hello"}' % model.encode()
    d50, b50 = await probe([home.url, stack.url], probes, small, "/tokenize")
    # /detokenize answers at once: the figure is the body's trip, not the engine's work.
    tokens = ",".join(["1"] * (LONG // 2))
    long = f'{{"tokens": [{tokens}], "model": "{model}"}}'.encode()
    n = max(5, probes // 4)
    h50, f50, l50 = await probe([home.url, other.url, stack.url], n, long, "/detokenize")
    return [
        f"  POST /tokenize, warm, c=1 (p50 of {probes}): node directly {d50:.2f} ms, "
        f"through HAProxy {b50:.2f} ms: the balancer adds {b50 - d50:.2f} ms "
        f"({b50 / d50:.2f}x)",
        f"  200 KB body, model after it (POST /detokenize, p50 of {n}): at its home "
        f"{h50:.2f} ms, forwarded by another node {f50:.2f} ms (+{f50 - h50:.2f} ms), "
        f"through HAProxy (any node, forwarded when not the home) {l50:.2f} ms",
    ]


# ----- the fleet cases of issue 35, each beside today's behaviour ------------------------

FLEET_MODELS = [TinyModel(name=f"f-{c}", seed=10 + i) for i, c in enumerate("abc")]


def death_spread() -> list[str]:
    """After a node's death, how many of its models each survivor takes (its models'
    first live node): bounded second choices (now) vs the plain rendezvous order after
    the home (before), over every node's death; pure placement, no process."""
    import math  # noqa: PLC0415

    from troupe.cluster import NodeFacts, Placement, rank  # noqa: PLC0415

    out = []
    for n_nodes, n_models in ((3, 6), (4, 12), (5, 12)):
        urls = [f"http://10.0.0.{i}:8080" for i in range(1, n_nodes + 1)]
        models = frozenset(f"model-{j}" for j in range(n_models))
        placement = Placement([NodeFacts(u, models, {m: m for m in models}) for u in urls])
        homes = placement.homes()
        worst_now = worst_before = 0
        for dead in urls:
            now: dict[str, int] = {}
            before: dict[str, int] = {}
            for model, home in homes.items():
                if home != dead:
                    continue
                order_now = [u for u in placement.order(model) if u != dead]
                order_before = [u for u in rank(model, urls) if u not in (home, dead)]
                now[order_now[0]] = now.get(order_now[0], 0) + 1
                before[order_before[0]] = before.get(order_before[0], 0) + 1
            worst_now = max(worst_now, *now.values(), 0)
            worst_before = max(worst_before, *before.values(), 0)
        bound = math.ceil(n_models / n_nodes) + 1
        out.append(
            f"  node death, {n_nodes} nodes x {n_models} models: most of a dead node's models "
            f"one survivor takes: now {worst_now}, before {worst_before} "
            f"(bound ceil(models/nodes)+1 = {bound})"
        )
    return out


async def _ttft(http: httpx.AsyncClient, model: str, tokens: int) -> tuple[float, str, str]:
    """(seconds to the first token, the node that served it, the finish reason)."""
    body = {
        "model": model,
        "prompt": "hi",
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
    }
    start = time.perf_counter()
    first = None
    reason = ""
    async with http.stream("POST", "/v1/completions", json=body) as resp:
        node = resp.headers.get("x-troupe-node", "")
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and first is None:
                first = time.perf_counter() - start
            if '"finish_reason":"length"' in line.replace(" ", ""):
                reason = "length"
    return (first if first is not None else float("nan")), node, reason


async def streams_over_slots(models_dir: Path, work: Path, streams: int, tokens: int) -> list[str]:
    """12 streams to a model whose child has 4 slots, warm on its home and on its third
    node, cold on its second: with the agent (now) and without (today's static maxconn
    8): p50/p95 time to first token, where they were served, HAProxy's view."""
    from troupe_rig.cluster import haproxy_command  # noqa: PLC0415

    out = []
    model = FLEET_MODELS[0].name
    for label, extra in (
        ("agent (now)", []),
        ("static maxconn 8 (today)", ["--cluster-agent-port", "off"]),
    ):
        async with open_cluster(
            work / label.split()[0], [models_dir] * 3, [*NODE_ARGS, *extra]
        ) as stack:
            home, second, third = stack.order(model)
            async with httpx.AsyncClient(base_url=stack.url, timeout=600) as http:
                await http.post(
                    "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1}
                )
                await http.post("/models/load", params={"node": third.name}, json={"model": model})
                await stack.loaded_on(model)
                await trio.sleep(3)  # the agents' checks (1 s) and the peers' lists (2 s)
                results: list[tuple[float, str, str]] = []

                async def one(into: list[tuple[float, str, str]]) -> None:
                    into.append(await _ttft(http, model, tokens))

                start = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for _ in range(streams):
                        nursery.start_soon(one, results)
                total = time.perf_counter() - start
            text = await haproxy_command(stack.socket, "show stat")
            # show stat: pxname, svname, qcur, qmax, scur, smax, ...; the model's backend
            rows = {
                r[1]: r
                for r in (line.split(",") for line in text.splitlines())
                if len(r) > 7 and r[0].split("_", 1)[-1] == model
            }
            smax = rows[home.name][5] if home.name in rows else "?"
            qmax = rows["BACKEND"][3] if "BACKEND" in rows else "?"
            ttft = sorted(t for t, _, _ in results)
            served = {
                n.name: sum(1 for _, s, _ in results if s == n.name) for n in (home, second, third)
            }
            loaded = await stack.loaded_on(model)
            out.append(
                f"  {streams} streams x {tokens} tokens, 4 slots, {label:<26} ttft p50 "
                f"{percentile(ttft, 50) * 1e3:7.0f} ms p95 {percentile(ttft, 95) * 1e3:7.0f} ms, "
                f"total {total:6.1f} s; served home {served[home.name]} / cold second "
                f"{served[second.name]} / warm third {served[third.name]}; home's most at once "
                f"{smax}, HAProxy's queue max {qmax}; cold loads on the second: "
                f"{int(second.name in loaded)}"
            )
    return out


async def stopped_home(models_dir: Path, work: Path) -> list[str]:
    """A home SIGSTOPped: a request another node forwards to it, with --cluster-timeout 1
    (now) and 3600 (today's: the forward's read timeout), the client giving up at 25 s."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    out = []
    model = FLEET_MODELS[1].name
    for label, timeout in (("--cluster-timeout 1 (now)", "1"), ("no watch (today)", "3600")):
        args = [*NODE_ARGS, "--cluster-timeout", timeout]
        async with open_cluster(work / f"stop{timeout}", [models_dir] * 3, args) as stack:
            home = stack.order(model)[0]
            forwarder = next(n for n in stack.nodes if n is not home)
            body = {"model": model, "prompt": "hello", "max_tokens": 4}
            async with httpx.AsyncClient(timeout=25) as http:
                await http.post(forwarder.url + "/v1/completions", json=body)
                assert home.process is not None
                pid = home.process.process.pid
                os.kill(pid, signal.SIGSTOP)
                try:
                    start = time.perf_counter()
                    try:
                        resp = await http.post(forwarder.url + "/v1/completions", json=body)
                        what = f"{resp.status_code} from {resp.headers.get('x-troupe-node')}"
                    except httpx.TimeoutException:
                        what = "client timed out"
                    took = time.perf_counter() - start
                finally:
                    os.kill(pid, signal.SIGCONT)
            out.append(
                f"  home SIGSTOPped, forwarded request, {label:<26} {what} after {took:5.1f} s"
            )
    return out


async def fleet(work: Path, streams: int, tokens: int) -> list[str]:
    write_tiny_models(work / "fleet-models", FLEET_MODELS)
    out = death_spread()
    out += await stopped_home(work / "fleet-models", work / "fleet")
    out += await streams_over_slots(work / "fleet-models", work / "fleet", streams, tokens)
    out += await failover_case(work)  # a conversation moved by failover (cluster_kv.py)
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--stream-tokens", type=int, default=400)
    parser.add_argument(
        "--only",
        choices=("trace", "fleet"),
        help="only the scale-out trace, or only the fleet cases",
    )
    args = parser.parse_args()
    order = trace(args.requests)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)
        write_tiny_models(work / "models", MODELS)
        print(
            f"trace: {args.requests} chat completions (8 tokens) over {len(MODELS)} models, "
            f"{args.clients} clients, --models-max 2 per node, default child flags; "
            "all nodes on this machine (they share its cores)"
        )
        if args.only != "fleet":
            print(await one_node(work / "models", work / "one", order, args.clients))
            for text in await three_nodes(
                work / "models", work / "three", order, args.clients, args.probes
            ):
                print(text)
        if args.only != "trace":
            print("fleet cases (issue 35), each beside today's behaviour:")
            for text in await fleet(work, args.streams, args.stream_tokens):
                print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
