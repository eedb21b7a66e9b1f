"""What the KV store's real-engine tests ask a router: completions and chats at
temperature 0, the store's usage in ``GET /models`` and its ``troupe_kv_*`` metrics."""

from __future__ import annotations

from typing import Any

from troupe_rig.router import RunningRouter

__all__ = ["chat", "complete", "kv_of", "metric", "text_of"]


async def chat(
    r: RunningRouter,
    model: str,
    messages: list[dict[str, str]],
    headers: dict[str, str] | None = None,
    **extra: object,
) -> dict[str, Any]:
    async with r.client(timeout=120) as http:
        body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0}
        body.update(extra)
        resp = await http.post("/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out


async def complete(r: RunningRouter, model: str, prompt: str, **extra: object) -> dict[str, Any]:
    async with r.client(timeout=120) as http:
        body = {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0}
        body.update(extra)
        resp = await http.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out


async def kv_of(
    r: RunningRouter, model: str, headers: dict[str, str] | None = None
) -> dict[str, int]:
    async with r.client(headers=headers) as http:
        data = (await http.get("/models")).json()["data"]
    found: dict[str, int] = {m["id"]: m for m in data}[model]["troupe"]["kv"]
    return found


async def metric(
    r: RunningRouter, name: str, headers: dict[str, str] | None = None, **labels: str
) -> float:
    async with r.client(headers=headers) as http:
        text = (await http.get("/metrics")).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, value = line.rsplit(" ", 1)
            got = ",".join(sorted(head[len(name) + 1 : -1].split(",")))
            if got == want:
                return float(value)
    return 0.0


def text_of(out: dict[str, Any]) -> str:
    choice = out["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])
