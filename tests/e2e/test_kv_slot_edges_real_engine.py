"""The KV store's slot steering and slot guard with the real engine and Gemma 3 270M.

- A slot a client holds busy with a long generation of its own (``id_slot``): a later
  request is not sent to it, to wait in the engine's queue for it while younger requests
  take the other slot; it is answered while the long generation still runs.
- ``POST /slots/N`` through the proxy on a child whose slot path is the store's: refused
  (the engine's own 501 for a child without ``--slot-save-path``) whatever the query or
  the body say, in the exact forms the engine reads differently from a first reading
  (a ``#fragment``, a repeated ``action``, a form-encoded body's fields); no file appears
  in the store's directory.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio

from troupe.demo import assemble_demo_model
from troupe_rig.kv import complete
from troupe_rig.router import RunningRouter, open_router, write_preset

pytestmark = pytest.mark.engine

REFUSED = "This server does not support slots action. Start it with `--slot-save-path`"


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return assemble_demo_model(tmp_path_factory.mktemp("demo-model"))


@asynccontextmanager
async def router(tmp_path: Path, engine: Path, gemma: Path) -> AsyncIterator[RunningRouter]:
    preset = {"a": {"model": str(gemma), "ctx-size": "2048", "parallel": "2"}}
    async with open_router(
        ["--models-preset", str(write_preset(tmp_path, preset))],
        engine=engine,
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    ) as running:
        yield running


async def test_a_request_is_not_sent_to_wait_behind_a_long_generation_on_its_slot(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    async with router(tmp_path, engine_path, gemma) as r:
        await complete(r, "a", "Hello")  # loaded, its slots read (both empty again later)
        generating = trio.Event()
        ended = trio.Event()

        async def long_generation() -> None:
            body = {
                "model": "a",
                "prompt": "Write a very long story about the sea.",
                "max_tokens": 900,
                "ignore_eos": True,
                "stream": True,
                "id_slot": 0,  # the client's own choice
            }
            async with (
                r.client(timeout=300) as http,
                http.stream("POST", "/v1/completions", json=body) as resp,
            ):
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        generating.set()
            ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_generation)
            await generating.wait()  # slot 0 is busy in the engine
            # Before: sent to slot 0 (empty in troupe's map), it waited in the engine's
            # queue until the long generation ended, while later requests took slot 1.
            for n in range(3):
                with trio.fail_after(120):
                    out = await complete(r, "a", f"Request {n}: the harbour at dawn.")
                assert out["choices"][0]["text"]
                assert not ended.is_set(), "answered only after the long generation ended"
            nursery.cancel_scope.cancel()


async def raw_post(url: str, target: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    """``POST target`` exactly as written (an HTTP client would drop a ``#fragment``)."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    head = (
        f"POST {target} HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: close\r\n"
        f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    async with stream:
        await stream.send_all(head + body)
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
    head_back, _, content = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head_back.lower():
        out = b""
        while content:
            size, _, rest = content.partition(b"\r\n")
            n = int(size, 16)
            out, content = out + rest[:n], rest[n + 2 :]
            if n == 0:
                break
        content = out
    return int(data.split(b" ", 2)[1]), content


def files_under(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*") if p.is_file()}


JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
SAVE = json.dumps({"model": "a", "filename": "mine.bin"}).encode()
# Valid JSON, and a form body whose fields include action=save (the engine reads both).
FORM_SAVE = b'{"model": "a", "filename": "mine.bin", "x": "&action=save&"}'


PAYLOADS = [
    ("/slots/0?action=save#", SAVE, JSON),  # the engine strips the fragment
    ("/slots/0?action=erase&action=save", SAVE, JSON),  # the engine takes the last
    ("/slots/0?action=erase", FORM_SAVE, FORM),  # and reads the form body's fields
    ("/slots/0?action=sav%65", SAVE, JSON),
    ("/slots/0?action=save", b'{"model": "a", "filename": "../../../escape.bin"}', JSON),
    ("/slots/0?action=restore", b'{"model": "a", "filename": "../x.bin"}', JSON),
    ("/slots/0?action=erase", SAVE, JSON),  # as without the store (no slot path): 501
]


async def test_no_slot_action_reaches_a_child_whose_slot_path_is_the_store_s(
    gemma: Path, tmp_path: Path, engine_path: Path
) -> None:
    async with router(tmp_path, engine_path, gemma) as r:
        await complete(r, "a", "Hello")
        store = tmp_path / "state" / "kv"
        before = files_under(store)
        assert before == set()  # nothing saved yet: anything that appears came through
        answers = {}
        for target, body, content_type in PAYLOADS:
            status, answer = await raw_post(r.url, target, body, content_type)
            message = json.loads(answer).get("error", {}).get("message") if answer else None
            answers[target, content_type] = (status, message)
        assert answers == dict.fromkeys(answers, (501, REFUSED))
        assert files_under(store) == before
        await complete(r, "a", "Hello again")  # the child still serves
