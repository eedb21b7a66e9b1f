"""The cluster tests' three nodes and what they send through the balancer with the
official ``openai`` SDK, unchanged (it runs in a thread: it is synchronous).

n1 and n2 list tiny-a, tiny-b and tiny-c; n3 lists only tiny-a and tiny-b, so tiny-c
may only go to n1 or n2. Every model has tokens for runs of ``x`` (`TinyModel.run_char`),
so a 200 KB chat of them is a few hundred tokens, served by the real engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2  # the HTTP library the SDK runs on
import openai
import trio
from openai.types.chat import ChatCompletion, ChatCompletionUserMessageParam

from troupe_rig.cluster import ClusterStack, open_cluster
from troupe_rig.tiny_gguf import TinyModel, write_tiny_models

__all__ = [
    "CTX",
    "LONG",
    "NAMES",
    "chat",
    "client",
    "cluster",
    "long_chat",
    "stream",
    "stream_to_end",
    "stream_until_cut",
    "write_catalogs",
]

LONG = 200_000  # bytes of message: past HAProxy's 16 KB
# A long context (32 MiB of KV each), so a long generation is still going when its node
# is killed (the tiny models make ~4,000 tokens a second).
CTX = 32768
NAMES = ("tiny-a", "tiny-b", "tiny-c")


def tiny(name: str, seed: int) -> TinyModel:
    return TinyModel(name, seed=seed, n_ctx=CTX, run_char="x", run_max=1024)


def write_catalogs(directory: Path) -> list[Path]:
    """The three nodes' models directories: the full one twice, then the partial one."""
    full, partial = directory / "full", directory / "partial"
    write_tiny_models(full, [tiny(n, i) for i, n in enumerate(NAMES)])
    partial.mkdir()
    for name in ("tiny-a", "tiny-b"):
        (partial / f"{name}.gguf").symlink_to(full / f"{name}.gguf")
    return [full, full, partial]


@asynccontextmanager
async def cluster(
    tmp_path: Path,
    catalogs: list[Path],
    haproxy_path: Path,
    maxconn: int = 8,
    tag_var: str | None = None,
    extra: Sequence[str] = (),
) -> AsyncIterator[ClusterStack]:
    args = ["--models-max", "2", "--ctx-size", str(CTX), *extra]
    async with open_cluster(
        tmp_path / "cluster",
        catalogs,
        args,
        haproxy=haproxy_path,
        maxconn=maxconn,
        tag_var=tag_var,
    ) as stack:
        yield stack


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def chat(url: str, model: str, content: str = "hi", **extra: Any) -> tuple[str, str]:
    """(the node HAProxy sent it to, the answer's text)."""
    node, text, _ = long_chat(url, model, content, **extra)
    return node, text


def long_chat(
    url: str, model: str, content: str, *, model_last: bool = False, **extra: Any
) -> tuple[str, str, int]:
    """(the node HAProxy sent it to, the answer's text, the prompt's tokens).

    The SDK writes ``model`` first; ``model_last`` sends the body as other clients (and
    the SDK's older versions) write it, ``model`` after the messages, through the SDK's
    own low-level request (``OpenAI.post``), its client unchanged."""
    message: ChatCompletionUserMessageParam = {"role": "user", "content": content}
    with client(url) as sdk:
        if model_last:
            body = {"messages": [message], "max_tokens": 4, **extra, "model": model}
            resp = sdk.post("/chat/completions", cast_to=httpx2.Response, body=body)
            headers, answer = resp.headers, ChatCompletion.model_validate(resp.json())
        else:
            raw = sdk.chat.completions.with_raw_response.create(
                model=model, messages=[message], max_tokens=4, **extra
            )
            headers, answer = raw.headers, raw.parse()
    tokens = answer.usage.prompt_tokens if answer.usage else 0
    return headers.get("x-troupe-node", ""), answer.choices[0].message.content or "", tokens


def stream(url: str, model: str) -> str:
    with client(url) as sdk:
        chunks = sdk.completions.create(model=model, prompt="hello", max_tokens=16, stream=True)
        return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)


def stream_until_cut(url: str, model: str, first: trio.Event) -> BaseException | None:
    """A long stream: ``first`` set once a token arrived; what ended it (None: it ended
    normally, which it must not where its node is killed)."""
    with client(url) as sdk:
        chunks = sdk.completions.create(
            model=model, prompt="hi", max_tokens=30000, stream=True, extra_body={"ignore_eos": True}
        )
        try:
            for _ in chunks:
                if not first.is_set():
                    trio.from_thread.run_sync(first.set)
        except (openai.APIError, httpx.HTTPError, httpx2.HTTPError) as exc:
            return exc
    return None


def stream_to_end(url: str, model: str, tokens: int, first: trio.Event) -> str:
    """A long stream read to its end: its finish reason."""
    reason = ""
    with client(url) as sdk:
        chunks = sdk.completions.create(
            model=model,
            prompt="hi",
            max_tokens=tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for chunk in chunks:
            if not first.is_set():
                trio.from_thread.run_sync(first.set)
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
    return reason
