"""troupe beside llama.cpp's own router, same flags and models: the same answers.

Both are started on the same models directory and asked the same questions; status
codes and bodies must match byte for byte, save what cannot (a build string, a clock,
a port) and troupe's one extra key in /models.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from troupe.sched import Status
from troupe_rig import open_engine
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/health", {}),
    ("GET", "/no/such/route", {}),
    ("POST", "/completion", {"json": {"model": "zz", "prompt": "x"}}),
    ("POST", "/completion", {"json": {"prompt": "x"}}),
    ("POST", "/completion", {"json": {"model": 7, "prompt": "x"}}),
    ("POST", "/completion?autoload=false", {"json": {"model": "tiny-a", "prompt": "x"}}),
    ("POST", "/models/load", {"json": {"model": "zz"}}),
    ("POST", "/models/unload", {"json": {"model": "zz"}}),
    ("POST", "/models/unload", {"json": {"model": "tiny-a"}}),
    ("GET", "/slots", {}),
    ("GET", "/slots?model=zz", {}),
    ("GET", "/tools", {}),
    ("POST", "/cors-proxy", {}),
    ("POST", "/v1/streams/lookup", {"content": b"nonsense"}),
    ("DELETE", "/v1/stream?conv_id=x", {}),
    ("GET", "/v1/stream", {}),
    ("GET", "/v1/stream?conv_id=x", {}),
    ("DELETE", "/models?model=zz", {}),
    ("DELETE", "/models", {}),
    ("POST", "/models", {"json": {"model": "t1"}}),
    ("POST", "/models", {"json": {}}),
]


@asynccontextmanager
async def cpp_router(engine: Path, models: Path) -> AsyncIterator[str]:
    argv = [str(engine), "--models-dir", str(models), "--port", "0", "--ctx-size", "256"]
    async with open_engine(argv, child=False) as proc:
        yield await proc.url()


# The flags CPU placement adds to a child's command line (shown as they are run, and
# under troupe.cpu); llama.cpp's router has no placement, so they are the one difference.
PLACEMENT_FLAGS = {"--threads", "--threads-batch", "--cpu-range", "--cpu-mask", "--cpu-strict"}
PLACEMENT_FLAGS |= {"--poll"}


def _normalise_models(body: dict[str, Any]) -> dict[str, Any]:
    for item in body["data"]:
        ours = item.pop("troupe", None)  # troupe's own facts, under one extra key
        item["created"] = 0
        args = item["status"]["args"]
        if ours is not None and (ours.get("cpu") or {}).get("placed_by") == "troupe":
            placed = [i for i, a in enumerate(args) if a in PLACEMENT_FLAGS]
            assert placed, args
            for i in reversed(placed):
                del args[i : i + 2]
        if ours is not None and "kv" in ours:  # the KV store's (troupe.kvstore)
            if "--slot-save-path" in args:
                i = args.index("--slot-save-path")
                del args[i : i + 2]
            for added in ("--swa-full", "--no-cache-idle-slots"):
                if added in args:
                    args.remove(added)
        if "--port" in args:
            args[args.index("--port") + 1] = "PORT"
    return body


async def answer(
    http: httpx.AsyncClient, method: str, path: str, kw: dict[str, Any]
) -> tuple[int, bytes]:
    resp = await http.request(method, path, **kw)
    return resp.status_code, resp.content


async def test_same_answers_as_the_cpp_router(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        cpp_router(engine_path, tiny_model_dir) as cpp_url,
        open_router(
            ["--models-dir", str(tiny_model_dir), "--ctx-size", "256"],
            engine=engine_path,
            state_dir=tmp_path / "s",
        ) as router,
        httpx.AsyncClient(base_url=cpp_url, timeout=30) as cpp,
        router.client() as ours,
    ):
        for method, path, kw in CALLS:
            want = await answer(cpp, method, path, kw)
            got = await answer(ours, method, path, kw)
            assert got == want, (method, path)
        # GET /: this engine build embeds no web UI, so upstream has nothing there (its
        # JSON 404); troupe answers as Ollama does for clients that probe it (its API).
        assert await answer(cpp, "GET", "/", {}) == await answer(cpp, "GET", "/no/such", {})
        assert await answer(ours, "GET", "/", {}) == (200, b"Ollama is running")

        want_props = (await cpp.get("/props")).json()
        got_props = (await ours.get("/props")).json()
        assert list(got_props) == list(want_props)
        assert {k: v for k, v in got_props.items() if k != "build_info"} == {
            k: v for k, v in want_props.items() if k != "build_info"
        }

        assert _normalise_models((await ours.get("/v1/models")).json()) == _normalise_models(
            (await cpp.get("/v1/models")).json()
        )

        # Preflight: the same CORS headers.
        pre = {"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"}
        want_h = (await cpp.options("/v1/chat/completions", headers=pre)).headers
        got_h = (await ours.options("/v1/chat/completions", headers=pre)).headers
        for name in (
            "access-control-allow-origin",
            "access-control-allow-credentials",
            "access-control-allow-methods",
            "access-control-allow-headers",
            "server",
        ):
            assert got_h.get(name) == want_h.get(name), name

        # After a load, the listing (with the child's own ready payload) still matches.
        async with cpp.stream("GET", "/models/sse") as events:
            for http in (cpp, ours):
                resp = await http.post("/models/load", json={"model": "tiny-b"})
                assert resp.json() == {"success": True}
            await router.wait_for_status("tiny-b", Status.LOADED)
            with trio.fail_after(30):
                async for line in events.aiter_lines():  # the C++ router's own events
                    event = json.loads(line[6:]) if line.startswith("data: ") else {}
                    if (event.get("data") or {}).get("status") == "loaded":
                        break
        got_models = _normalise_models((await ours.get("/v1/models")).json())
        want_models = _normalise_models((await cpp.get("/v1/models")).json())
        for item in (*got_models["data"], *want_models["data"]):
            if "meta" in item:
                item["created"] = 0
        assert json.dumps(got_models, sort_keys=True) == json.dumps(want_models, sort_keys=True)
        assert re.match(r"b", got_props["build_info"])
