"""A conversation moved by failover (issue 35, "KV follows the conversation"): three
nodes behind HAProxy, a conversation of ~4,000 tokens served on its model's home, the
home SIGKILLed, the next turn through the balancer. With ``--cluster-kv-replicas 1``
(now, the default) the home pushed the conversation's slot file to the next node after
the turn, which restores it; with ``--cluster-kv-replicas 0`` (today's behaviour) the
next node prefills the whole prompt. Printed: the prompt tokens the next turn evaluated
(``timings.prompt_n``), its time to first token, and the node that served it.

A tiny model larger than the tests' (8 layers, 512 wide: ~8 KiB of KV a token), so a
prefill of thousands of tokens costs something; all nodes on this one machine.

    .venv/bin/python bench/cluster_kv.py     (also: bench/cluster.py --cases kv)
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.cluster import ClusterStack, Node, open_cluster

MODEL = TinyModel(
    name="kv-conv", seed=40, n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1024, n_ctx=8192
)
CHARS = 4000  # about one token each (the tiny vocabulary's byte pieces)
CASES = (("replicas 1 (now)", []), ("--cluster-kv-replicas 0 (today)", ["0"]))


def conversation(seed: int = 1) -> list[dict[str, str]]:
    rng = random.Random(seed)
    words = []
    while sum(len(w) + 1 for w in words) < CHARS:
        words.append(
            "".join(rng.choice("abcdefghijklmnopqrstuvwyz") for _ in range(rng.randint(2, 7)))
        )
    return [{"role": "user", "content": " ".join(words)}]


async def turn(url: str, messages: list[dict[str, str]]) -> tuple[float, dict[str, Any], str, str]:
    """(seconds to the first token, the last chunk's timings, the node, the answer)."""
    body = {"model": MODEL.name, "messages": messages, "max_tokens": 8, "stream": True,
            "temperature": 0}  # fmt: skip
    start = time.perf_counter()
    first: float | None = None
    timings: dict[str, Any] = {}
    text = ""
    async with (
        httpx.AsyncClient(timeout=600) as http,
        http.stream("POST", url + "/v1/chat/completions", json=body) as resp,
    ):
        node = resp.headers.get("x-troupe-node", "")
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if first is None:
                first = time.perf_counter() - start
            event = json.loads(line[6:])
            timings = event.get("timings") or timings
            for choice in event.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    return (first if first is not None else float("nan")), timings, node, text


async def entries(stack: ClusterStack, node: Node) -> int:
    item = (await stack.own_models(node)).get(MODEL.name, {})
    return int(item.get("troupe", {}).get("kv", {}).get("entries", 0))


async def moved_by_failover(models_dir: Path, work: Path) -> list[str]:
    out = []
    for label, replicas in CASES:
        args = ["--models-max", "2", "--ctx-size", str(MODEL.n_ctx)]
        args += ["--cluster-kv-replicas", replicas[0]] if replicas else []
        async with open_cluster(
            work / (replicas[0] if replicas else "on"), [models_dir] * 3, args
        ) as stack:
            home, second, _ = stack.order(MODEL.name)
            messages = conversation()
            _, timings, node, text = await turn(stack.url, messages)
            assert node == home.name, node
            first_ttft, _, _, _ = await turn(stack.url, messages)  # (its own node: warm)
            if not replicas:
                with trio.fail_after(60):  # the push, in the background
                    while True:
                        if await entries(stack, second) >= 1:
                            break
                        await trio.sleep(0.1)
            else:
                await trio.sleep(2)  # as long as a push would take, for the same start
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": "and then?"}]  # fmt: skip
            await stack.kill(home)
            ttft, timings, node, _ = await turn(stack.url, messages)
            prompt = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
            evaluated = int(timings.get("prompt_n", -1))
            out.append(
                f"  conversation of {prompt} tokens moved by failover, {label:<32} "
                f"evaluated {evaluated:5d} ({100 * evaluated / max(prompt, 1):5.1f}%), "
                f"ttft {ttft * 1e3:6.0f} ms on {node} "
                f"(the same turn on its warm home before: {first_ttft * 1e3:4.0f} ms)"
            )
    return out


async def failover_case(work: Path) -> list[str]:
    """The case, its model written under ``work`` (bench/cluster.py's fleet case "kv")."""
    write_tiny_models(work / "kv-models", [MODEL])
    return await moved_by_failover(work / "kv-models", work / "kv")


async def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-kv-") as tmp:
        print(
            f"a conversation moved by failover: 3 nodes, HAProxy, {MODEL.name} "
            f"({MODEL.n_layer} layers x {MODEL.n_embd}), default child flags, one machine"
        )
        for text in await failover_case(Path(tmp)):
            print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
