"""The router's own routes and global middleware, compared with upstream's exact shapes."""

from __future__ import annotations

import json

import trio

from troupe.sched import Status
from troupe_rig.router import RouterFactory


async def test_health_is_ok_and_says_llama_cpp(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        for path in ("/health", "/v1/health"):
            resp = await http.get(path)
            assert resp.status_code == 200
            assert resp.content == b'{"status":"ok"}'
            assert resp.headers["server"] == "llama.cpp"
            assert resp.headers["content-type"] == "application/json; charset=utf-8"


async def test_router_props_shape(fake_router: RouterFactory) -> None:
    async with (
        fake_router({"a": {}}, "--models-max", "3", "--no-models-autoload") as router,
        router.client() as http,
    ):
        body = (await http.get("/props")).json()
        assert list(body) == [
            "role",
            "max_instances",
            "models_autoload",
            "model_alias",
            "model_path",
            "default_generation_settings",
            "ui_settings",
            "build_info",
            "cors_proxy_enabled",
        ]
        assert body["role"] == "router"
        assert body["max_instances"] == 3
        assert body["models_autoload"] is False
        assert body["default_generation_settings"] == {"params": None, "n_ctx": 0}
        assert body["build_info"].startswith("b")


async def test_models_list_before_and_after_load(fake_router: RouterFactory) -> None:
    async with (
        fake_router({"a": {"alias": "first,one"}, "b": {}}) as router,
        router.client() as http,
    ):
        listed = (await http.get("/v1/models")).json()
        assert listed["object"] == "list"
        a = listed["data"][0]
        assert [m["id"] for m in listed["data"]] == ["a", "b"]
        assert list(a)[:10] == [
            "id", "aliases", "tags", "object", "owned_by", "created", "status",
            "architecture", "source", "can_remove",
        ]  # fmt: skip
        assert a["aliases"] == ["first", "one"]
        assert a["status"]["value"] == "unloaded"
        assert "--port" in a["status"]["args"]
        assert a["status"]["args"][a["status"]["args"].index("--port") + 1] == "0"
        assert a["status"]["preset"].startswith("[a]\n")
        assert a["source"] == "preset"
        assert a["can_remove"] is False

        resp = await http.post("/models/load", json={"model": "one"})
        assert resp.json() == {"success": True}
        await router.wait_for_status("a", Status.LOADED)
        a = (await http.get("/models")).json()["data"][0]
        assert a["status"]["value"] == "loaded"
        assert "meta" in a  # merged from the child's ready payload
        port = a["status"]["args"][a["status"]["args"].index("--port") + 1]
        assert port == str(router.snapshot.models["a"].port)

        assert (await http.post("/models/unload", json={"model": "a"})).json() == {"success": True}
        await router.wait_for_status("a", Status.UNLOADED)
        a = (await http.get("/models")).json()["data"][0]
        assert a["status"]["value"] == "unloaded"
        assert "failed" not in a["status"]
        assert "meta" not in a


async def test_load_and_unload_errors(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.post("/models/load", json={"model": "nope"})
        assert resp.status_code == 404
        assert (
            resp.content
            == b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
            # not "model is not found": llama-server's HTTP library rewrites every 404 body
        )
        resp = await http.post("/models/unload", json={"model": "nope"})
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "model is not found"
        resp = await http.post("/models/unload", json={"model": "a"})
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "model is not running"
        await http.post("/models/load", json={"model": "a"})
        resp = await http.post("/models/load", json={"model": "a"})
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "model is already running"
        resp = await http.post("/models/load", content=b"{not json")
        assert resp.status_code == 400
        assert resp.json()["error"]["type"] == "invalid_request_error"


async def test_unknown_route_is_a_json_404(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.get("/no/such/route")
        assert resp.status_code == 404
        assert (
            resp.content
            == b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
        )


async def test_api_key(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--api-key", "k1,k2") as router, router.client() as http:
        assert (await http.get("/health")).status_code == 200  # public
        resp = await http.get("/models")
        assert resp.status_code == 401
        assert (
            resp.content
            == b'{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
        )
        ollama = await http.get("/api/tags")  # Ollama's API: Ollama's error shape
        assert ollama.status_code == 401
        assert ollama.json() == {"error": "Invalid API Key"}
        assert (
            await http.get("/models", headers={"Authorization": "Bearer k2"})
        ).status_code == 200
        assert (await http.get("/models", headers={"X-Api-Key": "k1"})).status_code == 200
        assert (
            await http.get("/models", headers={"Authorization": "Bearer nope"})
        ).status_code == 401
        # The key is forwarded to the child along with the request.
        resp = await http.post(
            "/tokenize",
            json={"model": "a", "content": "hi"},
            headers={"Authorization": "Bearer k1"},
        )
        assert resp.status_code == 200


async def test_cors_and_preflight(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.get("/health", headers={"Origin": "http://localhost:5173"})
        assert resp.headers["access-control-allow-origin"] == "http://localhost:5173"
        # No Origin (curl, SDKs): no header at all, not llama-server's empty echo.
        for path in ("/health", "/v1/models", "/api/tags"):
            resp = await http.get(path)
            assert "access-control-allow-origin" not in resp.headers, path
        resp = await http.options("/v1/chat/completions", headers={"Origin": "http://[::1]:3000"})
        assert resp.status_code == 200
        assert resp.content == b""
        assert resp.headers["content-type"].startswith("text/html")
        assert resp.headers["access-control-allow-credentials"] == "true"
        assert resp.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert resp.headers["access-control-allow-headers"] == "*"
    async with (
        fake_router({"a": {}}, "--cors-origins", "localhost") as router,
        router.client() as http,
    ):
        resp = await http.get("/health", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in resp.headers
        resp = await http.get("/health", headers={"Origin": "http://localhost:3000"})
        assert resp.headers["access-control-allow-origin"] == "http://localhost:3000"
    # An explicit --cors-origins '*' lets any page in, llama.cpp's echo and all.
    async with fake_router({"a": {}}, "--cors-origins", "*") as router, router.client() as http:
        resp = await http.get("/health", headers={"Origin": "http://example.org"})
        assert resp.headers["access-control-allow-origin"] == "http://example.org"


async def test_api_prefix(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--api-prefix", "/llm") as router, router.client() as http:
        assert (await http.get("/llm/health")).status_code == 200
        assert (await http.get("/health")).status_code == 200  # as upstream: probes work
        assert (await http.get("/llm/v1/health")).status_code == 200
        assert (await http.get("/v1/health")).status_code == 200
        assert (await http.get("/tokenize")).status_code == 404
        resp = await http.post("/llm/tokenize", json={"model": "a", "content": "hello"})
        assert resp.status_code == 200
        assert "tokens" in resp.json()


async def test_models_sse_reports_load_and_unload(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        events: list[dict[str, object]] = []
        async with trio.open_nursery() as nursery:

            async def listen() -> None:
                async with http.stream("GET", "/models/sse") as resp:
                    assert resp.headers["content-type"].startswith("text/event-stream")
                    async for line in resp.aiter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line[6:])
                            if not event["event"].startswith("troupe_"):
                                events.append(event)
                            if events[-1].get("data") == {"status": "unloaded", "exit_code": 0}:
                                nursery.cancel_scope.cancel()

            nursery.start_soon(listen)
            await router.ctx.scheduler.bus.wait_for_subscribers()
            await http.post("/models/load", json={"model": "a"})
            await router.wait_for_status("a", Status.LOADED)
            await http.post("/models/unload", json={"model": "a"})
            with trio.fail_after(20):
                await trio.sleep_forever()
        assert events[0] == {"model": "a", "event": "model_status", "data": {"status": "loading"}}
        assert any(
            e["event"] == "status_change" and e["data"]["status"] == "loaded" for e in events
        )  # type: ignore[index]
        assert events[-1] == {
            "model": "a",
            "event": "status_change",
            "data": {"status": "unloaded", "exit_code": 0},
        }


async def test_disabled_features_answer_403(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        resp = await http.get("/tools")
        assert resp.status_code == 403
        assert resp.json() == {
            "error": {"message": "this feature is disabled", "type": "feature_disabled"}
        }


async def test_not_ready_answers_503(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        router.ctx.ready = False
        resp = await http.get("/health")
        assert resp.status_code == 503
        assert (
            resp.content
            == b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
        )
        router.ctx.ready = True
