"""Real nginx (Debian's) with the shipped configs/nginx-troupe.conf in front of troupe.

Between nginx and troupe sits a plain TCP pipe that counts the connections nginx
opens, so keep-alive is measured where it happens. Children are the fake engine:
its slow token rate makes "still generating" a fact rather than a race, and it logs
how far it got when a client goes away.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from troupe.ops.logs import LogLine
from troupe_rig.nginx import SITE, Forwarder, Nginx, open_forwarder, open_nginx
from troupe_rig.realtime_client import EventLog, run_asyncio, sdk_client
from troupe_rig.router import RouterFactory, RunningRouter, open_router, write_preset

LIMIT = 128 << 20  # client_max_body_size 128m, and troupe's --max-body-mib default
TOKENS = 40
DISCONNECT = re.compile(r"fake: client disconnected after (\d+) of (\d+) tokens")


@attrs.frozen
class Stack:
    router: RunningRouter
    forwarder: Forwarder
    nginx: Nginx

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.nginx.url, timeout=httpx.Timeout(60.0))


@asynccontextmanager
async def nginx_stack(
    fake_router: RouterFactory, nginx_path: Path, tmp_path: Path
) -> AsyncIterator[Stack]:
    # 5 tokens a second: the first token goes out long before the last.
    presets = {"a": {"fake-tps": "5"}}
    async with (
        fake_router(presets) as router,
        open_forwarder(int(router.url.rsplit(":", 1)[1])) as forwarder,
        open_nginx(tmp_path / "nginx", forwarder.port, binary=nginx_path) as nginx,
    ):
        yield Stack(router, forwarder, nginx)


async def test_sse_is_unbuffered_and_a_client_abort_stops_the_child(
    fake_router: RouterFactory, nginx_path: Path, tmp_path: Path
) -> None:
    async with nginx_stack(fake_router, nginx_path, tmp_path) as stack, stack.client() as http:
        router = stack.router
        body = {"model": "a", "stream": True, "n_predict": TOKENS, "prompt": "hi"}
        with router.ctx.logs.subscribe("a") as log:
            async with http.stream("POST", "/completion", json=body) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                # Each event nginx passes on is a chunk of its own: a buffering proxy would
                # send one chunk of many events, or everything once the child is done.
                # (Load-progress comments come first while the model loads; two of them
                # may be read, and passed on, together on a loaded machine: dropped.)
                async with contextlib.aclosing(resp.aiter_raw()) as chunks:
                    first = b""
                    while not first:
                        events = (await anext(chunks)).split(b"\n\n")
                        first = b"".join(
                            e + b"\n\n" for e in events if e and not e.startswith(b":")
                        )
                assert first.count(b"data: ") == 1, first
                assert json.loads(first.removeprefix(b"data: "))["content"] == " hello"
                assert router.snapshot.models["a"].in_flight == 1  # still generating
            # The client is gone: nginx closes its connection to troupe, troupe its own to
            # the child, and the child stops generating.
            with trio.fail_after(30):
                while not (done := _disconnect(await log.receive())):
                    pass
        generated, asked = done
        assert asked == TOKENS
        assert generated < TOKENS
        with trio.fail_after(30):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)


def _disconnect(batch: tuple[list[LogLine], int]) -> tuple[int, int] | None:
    """(generated, asked) from the fake's line about a client that went away, if there."""
    for line in batch[0]:
        found = DISCONNECT.search(line.text)
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


async def test_keep_alive_connections_to_troupe_are_reused(
    fake_router: RouterFactory, nginx_path: Path, tmp_path: Path
) -> None:
    async with nginx_stack(fake_router, nginx_path, tmp_path) as stack:
        requests = 20
        for i in range(requests):
            # A new client connection each time: reuse is nginx's pool towards troupe.
            async with stack.client() as http:
                if i % 2:
                    resp = await http.post("/tokenize", json={"model": "a", "content": "hi"})
                else:
                    resp = await http.get("/v1/models")
                assert resp.status_code == 200, resp.text
        assert 1 <= stack.forwarder.connections < requests


async def test_body_at_the_limit_passes_and_one_byte_more_is_413(
    fake_router: RouterFactory, nginx_path: Path, tmp_path: Path
) -> None:
    async with nginx_stack(fake_router, nginx_path, tmp_path) as stack, stack.client() as http:
        head = b'{"model":"a","prompt":"x","max_tokens":1,"pad":"'
        tail = b'"}'
        body = head + b"p" * (LIMIT - len(head) - len(tail)) + tail
        assert len(body) == LIMIT
        headers = {"content-type": "application/json"}
        resp = await http.post("/v1/completions", content=body, headers=headers)
        assert resp.status_code == 200, resp.text[:500]
        assert resp.json()["usage"]["completion_tokens"] == 1
        resp = await http.post("/v1/completions", content=body + b" ", headers=headers)
        assert resp.status_code == 413  # nginx's own page: the body never reaches troupe
        assert "413" in resp.text


async def test_a_realtime_session_through_nginx_with_the_openai_sdk(
    engine_path: Path, tiny_model_dir: Path, nginx_path: Path, tmp_path: Path
) -> None:
    # The official SDK's realtime client, through the shipped site's /v1/realtime
    # location, to troupe and the real engine: a whole response, every event valid.
    preset = write_preset(tmp_path, {"tiny": {"model": str(tiny_model_dir / "tiny-a.gguf")}})
    async with (
        open_router(
            ["--models-preset", str(preset), "-c", "512"],
            engine=engine_path,
            state_dir=tmp_path / "state",
            cwd=tmp_path,
        ) as router,
        open_forwarder(int(router.url.rsplit(":", 1)[1])) as forwarder,
        open_nginx(tmp_path / "nginx", forwarder.port, binary=nginx_path) as nginx,
    ):

        async def scenario(url: str) -> list[str]:
            async with sdk_client(url).realtime.connect(model="tiny") as conn:
                log = EventLog(conn)
                assert (await log.next()).type == "session.created"
                item = {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hello through nginx"}],
                }
                await log.send({"type": "conversation.item.create", "item": item})
                await log.send({"type": "response.create", "response": {"max_output_tokens": 4}})
                return [e.type for e in await log.until("response.done")]

        kinds = await run_asyncio(scenario, nginx.url)
        assert "response.output_text.delta" in kinds
        assert kinds[-1] == "response.done"
        assert forwarder.connections >= 1  # it went through nginx
        with trio.fail_after(30):
            await router.ctx.scheduler.wait_until(lambda s: s.models["tiny"].in_flight == 0)


@pytest.mark.parametrize("line", ["listen 443 ssl http2;", "server 127.0.0.1:8080;"])
def test_the_shipped_site_still_has_the_lines_the_test_adapts(line: str) -> None:
    assert SITE.read_text().count(line) == 1
