"""A tenants file (``--tenants``), over real sockets with the fake engine: a model a key
may not use answers exactly as an unknown one and is absent from every listing (OpenAI,
llama.cpp and Ollama routes, the /models/sse feed); admin actions need ``admin``; an
admin from the file sees every tenant's records; ``POST /models/reload`` puts a new file
in effect without closing a connection or a stream, and keeps the old one when the new
one is bad."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio

from troupe.sched import Status
from troupe_rig import wire
from troupe_rig.router import RouterFactory, RunningRouter

KEYS = {"alice": "k-alice-1", "ops": "k-ops-2", "carol": "k-carol-3"}
MODELS = {"a": {}, "b": {}}

FILE = """\
[classes.interactive]
priority = 10

[[tenant]]
name = "alice"
key = "k-alice-1"
class = "interactive"
models = {alice_models}

[[tenant]]
name = "ops"
key_env = "OPS_KEY"
admin = true
"""
CAROL = """
[[tenant]]
name = "carol"
key_file = "carol.key"
"""


def write_file(tmp_path: Path, alice_models: list[str], extra: str = "") -> Path:
    (tmp_path / "carol.key").write_text(KEYS["carol"] + "\n")
    path = tmp_path / "tenants.toml"
    path.write_text(FILE.format(alice_models=json.dumps(alice_models)) + extra)
    return path


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def tenants_router(fake_router: RouterFactory, tmp_path: Path, alice_models: list[str]) -> Any:
    path = write_file(tmp_path, alice_models)
    return fake_router(MODELS, "--tenants", str(path), environ={"OPS_KEY": KEYS["ops"]})


def ids(doc: dict[str, Any]) -> list[str]:
    return [m["id"] for m in doc["data"]]


async def test_a_model_the_key_may_not_use_is_unknown_and_unlisted(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    async with (
        tenants_router(fake_router, tmp_path, ["a"]) as router,
        router.client() as http,
    ):
        assert (await http.get("/v1/models")).status_code == 401  # a key is needed
        assert ids((await http.get("/v1/models", headers=auth("alice"))).json()) == ["a"]
        assert ids((await http.get("/models", headers=auth("alice"))).json()) == ["a"]
        assert ids((await http.get("/v1/models", headers=auth("ops"))).json()) == ["a", "b"]
        tags = (await http.get("/api/tags", headers=auth("alice"))).json()
        assert [m["name"] for m in tags["models"]] == ["a:latest"]

        # The OpenAI routes: b answers as a name that is not there.
        for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
            ("/completion", {"prompt": "x"}),
        ):
            hidden = await http.post(path, json={**body, "model": "b"}, headers=auth("alice"))
            unknown = await http.post(path, json={**body, "model": "zz"}, headers=auth("alice"))
            assert hidden.status_code == unknown.status_code == 400
            assert hidden.json()["error"]["message"] == "model 'b' not found"
            assert hidden.json()["error"]["type"] == unknown.json()["error"]["type"]
            served = await http.post(path, json={**body, "model": "a"}, headers=auth("alice"))
            assert served.status_code == 200, served.text
        # Ollama's routes: Ollama's 404, word for word as for an unknown name.
        for path in ("/api/chat", "/api/show"):
            body = {"model": "b", "messages": [{"role": "user", "content": "x"}], "stream": False}
            hidden = await http.post(path, json=body, headers=auth("alice"))
            unknown = await http.post(path, json={**body, "model": "zz"}, headers=auth("alice"))
            assert hidden.status_code == unknown.status_code == 404
            assert hidden.json() == {"error": 'model "b" not found, try pulling it first'}
        # Load b (an admin's action): alice's /api/ps and /models still do not show it;
        # they show a, which her requests loaded (listed all along, also while it is
        # started again on a narrower CPU lane beside b).
        assert (await http.post("/models/load", json={"model": "b"}, headers=auth("ops"))).json()
        await router.wait_for_status("b", Status.LOADED)
        ps = (await http.get("/api/ps", headers=auth("alice"))).json()
        assert [m["name"] for m in ps["models"]] == ["a:latest"]
        ps = (await http.get("/api/ps", headers=auth("ops"))).json()
        assert [m["name"] for m in ps["models"]] == ["a:latest", "b:latest"]
        assert ids((await http.get("/models", headers=auth("alice"))).json()) == ["a"]


async def test_admin_actions_need_admin(fake_router: RouterFactory, tmp_path: Path) -> None:
    async with (
        tenants_router(fake_router, tmp_path, ["*"]) as router,
        router.client() as http,
    ):
        alice = auth("alice")
        refused = [
            await http.post("/models/load", json={"model": "a"}, headers=alice),
            await http.post("/models/unload", json={"model": "a"}, headers=alice),
            await http.post("/models", json={"model": "org/repo:Q4_K_M"}, headers=alice),
            await http.delete("/models", params={"model": "a"}, headers=alice),
            await http.post("/models/reload", headers=alice),
            await http.get("/models", params={"reload": "1"}, headers=alice),
            await http.get("/logs/stream", params={"no-history": "1"}, headers=alice),
        ]
        for resp in refused:
            assert resp.status_code == 403, resp.request.url
            assert resp.json()["error"]["type"] == "permission_error"
            assert "admin" in resp.json()["error"]["message"]
        assert router.status("a") is Status.UNLOADED  # nothing was loaded
        for method, path, body in (
            ("POST", "/api/pull", {"model": "org/repo:Q4_K_M"}),
            ("DELETE", "/api/delete", {"model": "a"}),
            ("POST", "/api/generate", {"model": "a", "keep_alive": 0}),  # an unload
        ):
            resp = await http.request(method, path, json=body, headers=alice)
            assert resp.status_code == 403, path
            assert "admin" in resp.json()["error"], path
        # Pulling a model that is there is no download: answered as Ollama does.
        pulled = await http.post("/api/pull", json={"model": "a", "stream": False}, headers=alice)
        assert pulled.json() == {"status": "success"}
        # Her keep_alive on a generation is not hers to set: served, the model stays.
        body = {"model": "a", "prompt": "hi", "stream": False, "keep_alive": 0}
        assert (await http.post("/api/generate", json=body, headers=alice)).status_code == 200
        assert router.status("a") is Status.LOADED
        # The admin may.
        ops = auth("ops")
        resp = await http.post("/models/unload", json={"model": "a"}, headers=ops)
        assert resp.json() == {"success": True}
        assert (await http.post("/models/reload", headers=ops)).json() == {"success": True}


async def test_an_admin_from_the_file_sees_every_tenants_records(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    async with (
        tenants_router(fake_router, tmp_path, ["*"]) as router,
        router.client() as http,
    ):
        for who in ("alice", "ops"):
            body = {"model": "a", "prompt": who, "n_predict": 2}
            assert (await http.post("/completion", json=body, headers=auth(who))).status_code == 200
        await router.ctx.requests.wait_until(lambda rec: rec.tenant == "ops")
        seen = {}
        for who in ("alice", "ops"):
            resp = await http.get("/troupe/requests", headers=auth(who))
            seen[who] = {item["tenant"] for item in resp.json()["data"]}
        assert seen == {"alice": {"alice"}, "ops": {"alice", "ops"}}


async def _sse_models(router: RunningRouter, who: str, into: trio.MemorySendChannel[str]) -> None:
    """The model of each /models/sse event ``who`` is sent."""
    async with (
        router.client() as http,
        http.stream("GET", "/models/sse", headers=auth(who)) as resp,
    ):
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                model = json.loads(line[6:]).get("model")
                if isinstance(model, str):
                    await into.send(model)


async def _until(models: trio.MemoryReceiveChannel[str], wanted: str) -> list[str]:
    """The models of the events up to the first about ``wanted``."""
    seen = []
    with trio.fail_after(20):
        async for model in models:
            seen.append(model)
            if model == wanted:
                return seen
    raise AssertionError(seen)


async def test_reload_takes_a_new_file_without_closing_a_connection_or_a_stream(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    async with tenants_router(fake_router, tmp_path, ["a"]) as router, router.client() as http:
        send, events = trio.open_memory_channel[str](100)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_sse_models, router, "alice", send)
            await router.ctx.scheduler.bus.wait_for_subscribers()
            # One connection, kept open across the reload.
            stream = await wire.connect(router)
            ask = (
                b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + KEYS["alice"].encode() + b"\r\n\r\n"
            )
            await stream.send_all(ask)
            first = await wire.first_answer(stream)
            assert first.startswith(b"HTTP/1.1 200")
            assert b'"id":"b"' not in first
            await http.post("/models/load", json={"model": "b"}, headers=auth("ops"))
            await router.wait_for_status("b", Status.LOADED)
            await http.post("/models/load", json={"model": "a"}, headers=auth("ops"))
            assert "b" not in await _until(events, "a")  # b's events came first, unseen

            # alice may now use b; carol is a new tenant.
            write_file(tmp_path, ["a", "b"], CAROL)
            resp = await http.post("/models/reload", headers=auth("ops"))
            assert resp.json() == {"success": True}
            await stream.send_all(ask)
            again = b""
            with trio.fail_after(10):
                while b'"object":"list"' not in again:
                    again += await stream.receive_some(65536)
            assert again.startswith(b"HTTP/1.1 200")
            assert b'"id":"b"' in again
            await stream.aclose()
            carol = await http.get("/v1/models", headers=auth("carol"))
            assert carol.status_code == 200
            # The stream opened before the reload now shows b's events.
            await http.post("/models/unload", json={"model": "b"}, headers=auth("ops"))
            await _until(events, "b")
            nursery.cancel_scope.cancel()

        # A bad file: the old book stays, and the answer says why.
        bad = write_file(tmp_path, ["a", "b"], CAROL + "modles = []\n")
        resp = await http.post("/models/reload", headers=auth("ops"))
        assert resp.status_code == 400
        message = resp.json()["error"]["message"]
        assert message.startswith("the model catalog was reloaded; the tenants file was kept")
        assert f"{bad}: line 18: tenant \"carol\": unknown key 'modles'" in message
        assert KEYS["carol"] not in resp.text
        assert (await http.get("/v1/models", headers=auth("carol"))).status_code == 200
        assert ids((await http.get("/v1/models", headers=auth("alice"))).json()) == ["a", "b"]


async def test_without_a_file_every_key_keeps_every_right(fake_router: RouterFactory) -> None:
    async with fake_router(MODELS, "--api-key", "k1,k2") as router, router.client() as http:
        for key in ("k1", "k2"):
            headers = {"Authorization": f"Bearer {key}"}
            assert ids((await http.get("/v1/models", headers=headers)).json()) == ["a", "b"]
            resp = await http.post("/models/load", json={"model": "a"}, headers=headers)
            assert resp.status_code in (200, 400), resp.text  # loaded, or already running
            assert (await http.post("/models/reload", headers=headers)).json() == {"success": True}
        assert (await http.get("/v1/models")).status_code == 401


async def test_realtime_handshake_refuses_a_model_the_key_may_not_use(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    async with tenants_router(fake_router, tmp_path, ["a"]) as router:
        port = wire.port_of(router)
        got = {}
        for model in ("b", "zz"):
            async with httpx.AsyncClient(base_url=router.url) as http:
                resp = await http.get(
                    f"/v1/realtime?model={model}",
                    headers={
                        **auth("alice"),
                        "Connection": "Upgrade",
                        "Upgrade": "websocket",
                        "Sec-WebSocket-Version": "13",
                        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    },
                )
            got[model] = (resp.status_code, resp.json()["error"]["message"])
        assert port
        assert got["b"] == (400, "model 'b' not found")
        assert got["zz"][0] == 400
