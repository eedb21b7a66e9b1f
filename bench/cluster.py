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


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--probes", type=int, default=200)
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
        print(await one_node(work / "models", work / "one", order, args.clients))
        for text in await three_nodes(
            work / "models", work / "three", order, args.clients, args.probes
        ):
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
