"""A conversation's KV follows it between nodes (issue 35): three ``troupe serve`` nodes
behind real HAProxy, the real engine on the tiny models (`troupe_rig.cluster_sdk`), the
official ``openai`` SDK through the balancer.

A long conversation is served on its model's home, which saves its slot after the turn
and pushes the file to the model's next node; when the home is SIGKILLed, the next turn
goes to that node, which restores the file: it evaluates under 5% of its prompt
(``timings.prompt_n``), not the whole prompt. A node that holds nothing for a
conversation asks its peers before a prefill (a fetch). The node-to-node routes take
only a node's own mark signed with the cluster secret: unsigned, forged, replayed for
another request or marked by the balancer, a fetch and a push get the same 401.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import trio
from openai.types.chat import ChatCompletionMessageParam

from troupe.cluster.kvsync import KV_FETCH, KV_PATH, KV_SEAL, KV_SHA256, seal_parts
from troupe.cluster.trust import ClusterTrust
from troupe_rig.cluster import ClusterStack, Node
from troupe_rig.cluster_sdk import client, cluster, write_catalogs

pytestmark = pytest.mark.engine

MODEL = "tiny-c"  # in the full catalog only: one path, one KV identity on every node
WORDS = 4000  # characters of the long message: about one token each (byte pieces)


def _long_message(seed: int) -> str:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwyz"
    return " ".join(
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(WORDS // 5)
    )


def _turn(url: str, messages: list[ChatCompletionMessageParam]) -> tuple[str, str, int, int]:
    """(the node that served it, the answer's text, the prompt's tokens, those evaluated)."""
    with client(url) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=4, temperature=0
        )
        answer = raw.parse()
    timings: Any = (answer.model_extra or {}).get("timings") or {}
    prompt = answer.usage.prompt_tokens if answer.usage else 0
    text = answer.choices[0].message.content or ""
    return raw.headers.get("x-troupe-node", ""), text, prompt, int(timings.get("prompt_n", -1))


async def _entries(stack: ClusterStack, node: Node) -> int:
    item = (await stack.own_models(node)).get(MODEL, {})
    return int(item.get("troupe", {}).get("kv", {}).get("entries", 0))


async def _until_entries(stack: ClusterStack, node: Node, at_least: int) -> None:
    # A push is in the background: the receiver's own list is asked until it shows it.
    with trio.fail_after(60):
        while True:
            if await _entries(stack, node) >= at_least:
                return
            await trio.sleep(0.1)


async def test_the_next_turn_after_the_home_dies_restores_the_pushed_slot(
    tmp_path: Path, haproxy_path: Path
) -> None:
    full = write_catalogs(tmp_path)[0]
    async with cluster(tmp_path, [full, full, full], haproxy_path) as stack:
        home, second, third = stack.order(MODEL)
        # Conversation A: served on its home, its slot pushed to the second node.
        a: list[ChatCompletionMessageParam] = [{"role": "user", "content": _long_message(1)}]
        node, text, prompt, evaluated = await trio.to_thread.run_sync(_turn, stack.url, a)
        assert node == home.name
        assert prompt > 2000  # a long conversation: thousands of tokens
        assert evaluated > prompt * 0.9  # its first turn: all of it evaluated
        a += [{"role": "assistant", "content": text}, {"role": "user", "content": "and then?"}]

        # Conversation B, served on its home, then its next turn straight on the third
        # node (a signed mark: served where it lands, as after a spill): the third holds
        # nothing of it and fetches the slot file from a peer before the prefill.
        b: list[ChatCompletionMessageParam] = [{"role": "user", "content": _long_message(2)}]
        _, text_b, _, _ = await trio.to_thread.run_sync(_turn, stack.url, b)
        await _until_entries(stack, second, 2)  # A's and B's pushed there
        assert await _entries(stack, third) == 0
        b += [{"role": "assistant", "content": text_b}, {"role": "user", "content": "more?"}]
        answer = await _direct_turn(stack, third, b)
        assert answer["usage"]["prompt_tokens"] > 2000
        assert answer["timings"]["prompt_n"] < 0.05 * answer["usage"]["prompt_tokens"]

        # The third unloads its copy (else, warm, it would take the next turn: it would
        # fetch A's file as it did B's). The home dies; A's next turn goes to the second
        # node, which restores the file the home pushed to it.
        await _unload(stack, third)
        await stack.kill(home)
        node, _, prompt, evaluated = await trio.to_thread.run_sync(_turn, stack.url, a)
        # (HAProxy learns of the unload at its next agent check: the third may still
        # take it, and would then fetch A's file from the second.)
        assert node in (second.name, third.name)
        assert prompt > 2000
        assert 0 <= evaluated < 0.05 * prompt, (evaluated, prompt)

        await _refused_without_a_nodes_mark(stack, second)


async def _unload(stack: ClusterStack, node: Node) -> None:
    target = "/models/unload"
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(
            node.url + target, json={"model": MODEL}, headers=stack.own_headers("POST", target)
        )
    assert resp.status_code == 200, resp.text
    with trio.fail_after(60):
        while True:
            status = (await stack.own_models(node))[MODEL]["status"]["value"]
            if status == "unloaded":
                return
            await trio.sleep(0.1)


async def _direct_turn(
    stack: ClusterStack, node: Node, messages: list[ChatCompletionMessageParam]
) -> Any:
    target = "/v1/chat/completions"
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(
            node.url + target, json=body, headers=stack.own_headers("POST", target)
        )
    assert resp.status_code == 200, resp.text
    return resp.json()


async def _refused_without_a_nodes_mark(stack: ClusterStack, node: Node) -> None:
    """Every way in but a node's own signed mark gets the same 401, whether the store
    holds the entry asked for or not; the signed fetch itself gets the file (sealed)."""
    ident = _ident_of(node)
    tenant = ""
    fetch = (
        f"{KV_FETCH}?{urlencode({'model': MODEL, 'ident': ident, 'tenant': tenant, 'better': 0})}"
    )
    absent = f"{KV_FETCH}?{urlencode({'model': MODEL, 'ident': '0' * 20, 'better': 0})}"
    tokens = json.dumps({"tokens": list(range(1, 300))}).encode()
    push = f"{KV_PATH}?{urlencode({'model': MODEL, 'ident': ident, 'sha256': '0' * 64})}"
    trust = ClusterTrust(stack.secret.encode())
    other = ClusterTrust(b"not the cluster's secret")
    async with httpx.AsyncClient(timeout=30) as http:

        async def post(url: str, target: str, headers: dict[str, str]) -> httpx.Response:
            return await http.post(url + target, content=tokens, headers=headers)

        refused: list[httpx.Response] = []
        for target in (fetch, absent, push):
            refused += [
                await post(node.url, target, {}),
                await post(node.url, target, {"authorization": "Bearer some user key"}),
                await post(node.url, target, _mark(other, "POST", target)),
                await post(node.url, target, _mark(trust, "POST", KV_FETCH + "?other")),
                await post(node.url, target, {"x-troupe-forwarded": trust.balancer_mark()}),
                await post(stack.url, target, {}),  # through HAProxy: the balancer's mark
            ]
        assert {r.status_code for r in refused} == {401}
        assert len({r.content for r in refused}) == 1  # nothing tells what the store holds

        # The signed fetch of A's conversation: the file and its seal.
        first = await _first_entry_tokens(node, ident)
        body = json.dumps({"tokens": first}).encode()
        resp = await http.post(node.url + fetch, content=body, headers=_mark(trust, "POST", fetch))
        assert resp.status_code == 200
        sha256 = resp.headers[KV_SHA256.decode()]
        assert trust.sealed(resp.headers[KV_SEAL.decode()], *seal_parts(ident, tenant, sha256))
        # Another tenant's key on the same tokens: none of its own, nothing served.
        other_tenant = fetch.replace("tenant=&", "tenant=bob&")
        resp = await http.post(
            node.url + other_tenant, content=body, headers=_mark(trust, "POST", other_tenant)
        )
        assert resp.status_code == 404


def _mark(trust: ClusterTrust, method: str, target: str) -> dict[str, str]:
    return {"x-troupe-forwarded": trust.mark("test", method, target).decode()}


def _ident_of(node: Node) -> str:
    """The one KV identity directory the node's store has."""
    idents = [d.name for d in (node.state_dir / "kv").iterdir() if d.is_dir()]
    assert len(idents) == 1, idents
    return idents[0]


async def _first_entry_tokens(node: Node, ident: str) -> list[int]:
    sidecars = sorted((node.state_dir / "kv" / ident).glob("*.json"))
    assert sidecars
    tokens: list[int] = json.loads(sidecars[0].read_text())["tokens"]
    return tokens
