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

Then the fleet cases of issue 35 (``--only fleet``; ``--cases`` picks some of
spread, stopped, streams, swaps, checks, tls), each printed beside today's behaviour:
measured again where a switch or a rewritten HAProxy configuration gives it back, else
the issue's own observation, labelled so.

    .venv/bin/python bench/cluster.py [--requests N] [--clients N] [--probes N]
    .venv/bin/python bench/cluster.py --only fleet --cases swaps,checks,tls
"""

from __future__ import annotations

import argparse
import json
import math
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


async def run_trace(
    url: str,
    models: list[str],
    clients: int,
    failed: list[str] | None = None,
    served: dict[str, dict[str, int]] | None = None,
) -> tuple[float, list[float]]:
    """Total seconds and each request's latency (s); every answer must be a 200 (or,
    with ``failed``, what went wrong is added there); ``served``: model -> the node that
    served each (X-Troupe-Node) -> how many."""
    latencies: list[float] = []

    async def client(i: int, http: httpx.AsyncClient) -> None:
        for model in models[i::clients]:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 8,
            }
            start = time.perf_counter()
            try:
                resp = await http.post("/v1/chat/completions", json=body)
            except httpx.TransportError as exc:
                if failed is None:
                    raise
                failed.append(f"{model}: {exc!r}")
                continue
            latencies.append(time.perf_counter() - start)
            if served is not None:
                by_node = served.setdefault(model, {})
                node = resp.headers.get("x-troupe-node", "?")
                by_node[node] = by_node.get(node, 0) + 1
            if resp.status_code != 200:
                if failed is None:
                    raise RuntimeError(f"{model}: {resp.status_code} {resp.text[:200]}")
                failed.append(f"{model}: {resp.status_code} {resp.text[:100]}")

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(client, i, http)
        return time.perf_counter() - start, sorted(latencies)


async def probe(
    urls: list[str], n: int, body: bytes, path: str, verify: str | bool = True
) -> list[float]:
    """``n`` rounds of one request to each of ``urls`` in turn (so the machine's drift
    falls on all alike), each on its own keep-alive connection: each URL's median (ms)."""
    out: list[list[float]] = [[] for _ in urls]
    headers = {"content-type": "application/json"}
    clients = [httpx.AsyncClient(base_url=u, timeout=60, verify=verify) for u in urls]
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


SWAP_MODELS = [TinyModel(name=f"s-{i:02d}", seed=30 + i) for i in range(12)]


def today_order(config: str, urls: list[str]) -> str:
    """``config`` as HAProxy's configuration was before bounded second choices and
    before its own error pages were JSON: each model backend's servers after the home
    in plain rendezvous order (``balance first`` goes by ``id``), no ``http-error``."""
    from troupe.cluster import rank  # noqa: PLC0415

    by_name = {f"n{i}": u for i, u in enumerate(urls, 1)}
    out: list[str] = []
    block: list[str] = []
    model = ""

    def flush() -> None:
        servers = [ln for ln in block if ln.startswith("    server ")]
        if not model or not servers:
            out.extend(block)
            return
        names = [ln.split()[1] for ln in servers]
        order = rank(model, [by_name[n] for n in names if not n.endswith("-cold")])
        home = names[0]
        warm = [u for u in order if u != by_name[home]]
        key = {by_name[home]: 0, **{u: i + 1 for i, u in enumerate(warm)}}

        def place(line: str) -> int:
            name = line.split()[1]
            cold = name.endswith("-cold")
            return key[by_name[name.removesuffix("-cold")]] + (len(key) if cold else 0)

        ordered = sorted(servers, key=place)
        renumbered = [re.sub(r" id \d+ ", f" id {i} ", ln) for i, ln in enumerate(ordered, 1)]
        first = block.index(servers[0])  # (the server lines are together, in place)
        out.extend([*block[:first], *renumbered, *block[first + len(servers) :]])

    for line in config.splitlines():
        if line.startswith("    http-error "):
            continue
        if line and not line.startswith(" "):
            flush()
            block, model = [], ""
            if line.startswith("backend m") and "  # " in line:
                model = line.split("  # ", 1)[1]
        block.append(line)
    flush()
    return "\n".join(out) + "\n"


async def node_loads(url: str) -> int:
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(url + "/metrics")).text
    return int(sum(float(v) for v in _LOADS.findall(text)))


async def death_swaps(models_dir: Path, work: Path, requests: int, clients: int) -> list[str]:
    """4 nodes, 12 models, --models-max 2 (each node home to 3: it swaps already), a
    trace over every model, a node SIGKILLed with a long answer in flight on it, the
    same trace again: each survivor's loads per second after vs before, where the dead
    node's models' requests went, and the in-flight request's answer. Now (bounded
    second choices, HAProxy's errors as JSON), then, on the same nodes with the same
    node killed again once it is back, today (the configuration rewritten as before)."""
    out = []
    names = [m.name for m in SWAP_MODELS]
    rng = random.Random(3)
    order = [rng.choice(names) for _ in range(requests)]
    args = [*NODE_ARGS, "--cluster-copy-ttl", "1"]  # (copies go back once it is up)
    async with open_cluster(work, [models_dir] * 4, args, check_interval="500ms") as stack:
        victim, shared = _worst_victim(stack, names)
        survivors = [n for n in stack.nodes if n is not victim]
        mine = [m for m in names if stack.order(m)[0] is victim]
        for label in ("bounded (now)", "rank order (today)"):
            if label.endswith("(today)"):
                await stack.start(victim)
                await stack.wait_status(victim.name, "UP")
                await _reload_as_today(stack)
            failed: list[str] = []
            await run_trace(stack.url, names, clients, failed)  # warm: every model once
            start = {n.name: await node_loads(n.url) for n in survivors}
            pre_took, _ = await run_trace(stack.url, order, clients, failed)
            at_kill = {n.name: await node_loads(n.url) for n in survivors}
            got = await _killed_in_flight(stack, victim, mine[0])
            await stack.wait_status(victim.name, "DOWN")
            at_down = {n.name: await node_loads(n.url) for n in survivors}
            served: dict[str, dict[str, int]] = {}
            post_took, _ = await run_trace(stack.url, order, clients, failed, served)
            end = {n.name: await node_loads(n.url) for n in survivors}
            took: dict[str, int] = {}
            for model in mine:
                for node, count in served.get(model, {}).items():
                    took[node] = took.get(node, 0) + count
            pre = {k: (at_kill[k] - start[k]) / pre_took for k in start}
            post = {k: (end[k] - at_down[k]) / post_took for k in start}
            worst = max(post, key=lambda k: post[k] / max(pre[k], 1e-9))
            ratio = post[worst] / pre[worst] if pre[worst] else math.inf
            kind = got.headers.get("content-type", "?").split(";")[0]
            spread = " ".join(f"{n} {c}" for n, c in sorted(took.items()))
            out.append(
                f"  node death, 4 nodes x 12 models, {label:<19} {victim.name} killed (today's "
                f"order gives {shared} of its {len(mine)} models one second node): their "
                f"requests after went to {spread}; loads/s per survivor before {_rates(pre)} "
                f"after {_rates(post)}: worst {ratio:.1f}x ({worst}); in-flight request: "
                f"{got.status_code} {kind}; trace requests failed: {len(failed)}"
            )
            for what in failed[:3]:
                out.append(f"    failed: {what}")
    return out


def _worst_victim(stack: ClusterStack, names: list[str]) -> tuple[Node, int]:
    """The node whose models share a second node most in the plain rendezvous order
    (today's): the case issue 35 saw (the same choice for both configurations)."""
    from troupe.cluster import rank  # noqa: PLC0415

    urls = [n.url for n in stack.nodes]
    best: tuple[Node, int] = (stack.nodes[0], 0)
    for node in stack.nodes:
        seconds: dict[str, int] = {}
        for model in names:
            if stack.order(model)[0] is node:
                second = next(u for u in rank(model, urls) if u != node.url)
                seconds[second] = seconds.get(second, 0) + 1
        most = max(seconds.values(), default=0)
        if most > best[1]:
            best = (node, most)
    return best


def _rates(rates: dict[str, float]) -> str:
    return "/".join(f"{v:.2f}" for _, v in sorted(rates.items()))


async def _reload_as_today(stack: ClusterStack) -> None:
    """HAProxy reloaded (master-worker: new workers) on `today_order`'s configuration."""
    import signal  # noqa: PLC0415

    from troupe_rig.cluster import haproxy_command  # noqa: PLC0415

    old = stack.config
    stack.config = today_order(old, [n.url for n in stack.nodes])
    assert stack.config != old
    (stack.directory / "haproxy.cfg").write_text(stack.config)
    pid = _worker_pid(await haproxy_command(stack.socket, "show info"))
    assert stack.haproxy is not None
    stack.haproxy.send_signal(signal.SIGUSR2)
    with trio.fail_after(60):  # the runtime API answers from the new worker once it runs
        while _worker_pid(await haproxy_command(stack.socket, "show info")) == pid:  # noqa: ASYNC110
            await trio.sleep(0.1)
    for node in stack.nodes:
        await stack.wait_status(node.name, "UP")


def _worker_pid(info: str) -> str:
    return next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("Pid:")), ""
    )


async def _killed_in_flight(stack: ClusterStack, victim: Node, model: str) -> httpx.Response:
    """A long answer for ``model`` through the balancer, in flight on ``victim`` when it
    is SIGKILLed: what the client got."""

    long = {"model": model, "prompt": "hi", "max_tokens": 30000, "ignore_eos": True}
    got: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as http:

        async def whole() -> None:
            got.append(await http.post("/v1/completions", json=long))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(whole)
            with trio.fail_after(60):
                while True:
                    item = (await stack.own_models(victim)).get(model, {})
                    if item.get("troupe", {}).get("in_flight", 0) >= 1:
                        break
                    await trio.sleep(0.05)
            await stack.kill(victim)
    return got[0]


async def own_record(url: str, model: str) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=30) as http:
        got = await http.get(url + "/troupe/requests", params={"model": model})
    data = got.json()["data"]
    return data[0] if data else {}


async def fleet_checks(models_dir: Path, work: Path) -> list[str]:
    """The forwarding node's record and X-Troupe-Node, the fleet view, a forged forward
    mark and the give-back of a copy: with a cluster secret and --cluster-copy-ttl 2
    (now) and without a secret, the default TTL (today's trust; a copy kept)."""
    model = FLEET_MODELS[2].name
    out = []
    for label, env, ttl in (
        ("now", None, "2"),
        ("today", {"TROUPE_CLUSTER_SECRET": ""}, "300"),
    ):
        args = [*NODE_ARGS, "--cluster-copy-ttl", ttl]
        async with open_cluster(work / f"checks-{label}", [models_dir] * 3, args, env=env) as stack:
            home, second, third = stack.order(model)
            # 200 KB of tokens to detokenize, the model after them: past HAProxy's buffer
            tokens = [1] * (LONG // 2)
            body = json.dumps({"tokens": tokens, "model": model}).encode()
            async with httpx.AsyncClient(timeout=60) as http:
                resp = await http.post(
                    second.url + "/detokenize",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                rec = await own_record(second.url, model)
                served = await own_record(home.url, model)
                if label == "now":  # (before: no record, no metric, the landing node named)
                    out.append(
                        f"  forwarded (model after 200 KB, to {second.name}), {label:<5} "
                        f"{resp.status_code}, X-Troupe-Node {resp.headers.get('x-troupe-node')} "
                        f"(served by {home.name}); forwarder's record: kind {rec.get('kind')} "
                        f"node {rec.get('node') or '-'} bytes_out {rec.get('bytes_out')} "
                        f"(home's {served.get('bytes_out')})"
                    )
                else:
                    out.append(
                        f"  forwarded, {label:<5} (issue 35's observation, not run again: the "
                        "code is gone) no access line, no metric; X-Troupe-Node the landing node"
                    )
                forged = await http.post(
                    third.url + "/v1/completions",
                    json={"model": model, "prompt": "hi", "max_tokens": 2},
                    headers={"x-troupe-forwarded": "n1"},
                )
                loaded = await stack.loaded_on(model)
                out.append(
                    f"  forged x-troupe-forwarded to {third.name} (not the home), {label:<5} "
                    f"{forged.status_code}; {model} loaded on {sorted(loaded)}"
                )
                # A copy on the third node (asked of it by name), then idle.
                await http.post(
                    stack.url + "/models/load", params={"node": third.name}, json={"model": model}
                )
                start = time.perf_counter()
                with trio.move_on_after(30):
                    while third.name in await stack.loaded_on(model):  # noqa: ASYNC110
                        await trio.sleep(0.5)
                took = time.perf_counter() - start
                kept = third.name in await stack.loaded_on(model)
                out.append(
                    f"  copy on {third.name} while its home is up, {label:<5} "
                    + (
                        f"still loaded after {took:.0f} s (--cluster-copy-ttl {ttl})"
                        if kept
                        else f"given back after {took:.1f} s idle (--cluster-copy-ttl {ttl})"
                    )
                )
            if label != "now":
                out.append(
                    f"  fleet view, {label:<5} (issue 35's observation) /metrics, /models/sse, "
                    "/troupe/* through the balancer: a random node each time; no cluster ps"
                )
                continue
            rows = await trio.to_thread.run_sync(_cluster_ps, stack)
            out.append(
                f"  troupe cluster ps, {label:<5} {len(rows)} rows: "
                + ", ".join(f"{r['node']} {r['name']} {r['status']}" for r in rows)
            )
    return out


def _cluster_ps(stack: ClusterStack) -> list[dict[str, object]]:
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    env = {
        **os.environ,
        "TROUPE_CLUSTER_SECRET": stack.env.get("TROUPE_CLUSTER_SECRET", stack.secret),
    }
    argv = [sys.executable, "-m", "troupe", "cluster", "ps", "--nodes", str(stack.nodes_file)]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, check=True)
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(a CA's certificate, a certificate for 127.0.0.1 it signed, its key): openssl."""
    import subprocess  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert, ext = (
        directory / n for n in ("ca.key", "ca.pem", "n.key", "n.csr", "n.pem", "san.ext")
    )
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for argv in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=ca"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        [
            *("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial"),
            *("-out", cert, "-days", "1", "-extfile", ext),
        ],
    ):
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)
    return ca, cert, key


async def tls_case(models_dir: Path, work: Path, probes: int) -> list[str]:
    """Between HAProxy and the nodes and between nodes: TLS with a CA made here (now)
    vs plain HTTP (today's only option): a short completion through the balancer and a
    forwarded one (a node to the model's home), p50 of ``probes`` each."""
    model = FLEET_MODELS[0].name
    ca, cert, key = _certificates(work / "certs")
    small = b'{"model": "%s", "prompt": "hi", "max_tokens": 1}' % model.encode()
    out = []
    for label, extra, env, render in (
        (
            "TLS (now)",
            ["--ssl-cert-file", str(cert), "--ssl-key-file", str(key)],
            {"SSL_CERT_FILE": str(ca)},
            ["--ca-file", str(ca)],
        ),
        ("plain (today)", [], None, []),
    ):
        async with open_cluster(
            work / label.split()[0],
            [models_dir] * 2,
            [*NODE_ARGS, *extra],
            env=env,
            render_args=render,
        ) as stack:
            home, other = stack.order(model)
            b50, f50 = await probe(
                [stack.url, other.url], probes, small, "/v1/completions", verify=str(ca)
            )
            verify = "ssl verify required" in stack.config
            out.append(
                f"  {label:<14} nodes {stack.nodes[0].url.split(':')[0]}, HAProxy verifies: "
                f"{verify}; completion (1 token) through HAProxy p50 {b50:.1f} ms, "
                f"forwarded by {other.name} to {home.name} p50 {f50:.1f} ms"
            )
    return out


CASES = ("spread", "stopped", "streams", "swaps", "checks", "tls", "kv")


async def fleet(work: Path, args: argparse.Namespace) -> list[str]:
    cases = set(args.cases.split(",")) if args.cases else set(CASES)
    write_tiny_models(work / "fleet-models", FLEET_MODELS)
    out = death_spread() if "spread" in cases else []
    if "stopped" in cases:
        out += await stopped_home(work / "fleet-models", work / "fleet")
    if "streams" in cases:
        out += await streams_over_slots(
            work / "fleet-models", work / "fleet", args.streams, args.stream_tokens
        )
    if "swaps" in cases:
        write_tiny_models(work / "swap-models", SWAP_MODELS)
        # 4 clients: never more than a child's 4 slots of one model in flight, so no
        # spill leaves a warm copy that would take a dead node's model (the agent prefers
        # it to the order's cold line): what is measured is the order's spread alone.
        out += await death_swaps(work / "swap-models", work / "swaps", args.swap_requests, 4)
    if "checks" in cases:
        out += await fleet_checks(work / "fleet-models", work / "checks")
    if "tls" in cases:
        out += await tls_case(work / "fleet-models", work / "tls", max(20, args.probes // 10))
    if "kv" in cases:
        out += await failover_case(work)  # a conversation moved by failover (cluster_kv.py)
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--stream-tokens", type=int, default=400)
    parser.add_argument("--swap-requests", type=int, default=240)
    parser.add_argument(
        "--cases", help=f"the fleet cases to run, comma-separated (default all: {','.join(CASES)})"
    )
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
            for text in await fleet(work, args):
                print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
