"""Requests the server answers before any route runs still leave an access record
(one line per request): a missing key, a foreign Host, an unknown route, bytes
that are not HTTP, a body over the limit. Over real sockets, read back through
``GET /troupe/requests?kind=local`` as an operator would."""

from __future__ import annotations

from typing import Any

from troupe_rig.router import RouterFactory
from troupe_rig.wire import exchange

KEY = {"Authorization": "Bearer SECRET"}


async def test_refusals_at_the_door_are_recorded_with_why(fake_router: RouterFactory) -> None:
    async with (
        fake_router({"a": {}}, "--api-key", "SECRET", "--access-log", "on") as router,
        router.client() as http,
    ):
        assert (await http.get("/v1/models")).status_code == 401
        assert (await http.get("/no/such/route", headers=KEY)).status_code == 404
        wire = b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        assert (await exchange(router, wire)).startswith(b"HTTP/1.1 403 ")
        assert (await exchange(router, b"NOT HTTP AT ALL\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        # A body over the router's own limit for a local route, refused at its head.
        big = b"POST /models/load HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer SECRET"
        big += b"\r\nContent-Length: 99999999\r\n\r\n{"
        assert (await exchange(router, big)).startswith(b"HTTP/1.1 413 ")

        await router.ctx.requests.wait_until(lambda r: r.status == 413)
        resp = await http.get("/troupe/requests", params={"kind": "local"}, headers=KEY)
        assert resp.status_code == 200
        seen: dict[int, dict[str, Any]] = {}
        for item in resp.json()["data"]:
            seen.setdefault(item["status"], item)
    assert {401, 404, 403, 400, 413} <= set(seen)
    assert seen[401]["path"] == "/v1/models"
    assert seen[401]["error"] == "Invalid API Key"
    assert seen[404]["path"] == "/no/such/route"
    assert seen[404]["error"] == "File Not Found"
    assert "Host not allowed" in seen[403]["error"]
    assert seen[413]["path"] == "/models/load"
    assert "larger than the limit" in seen[413]["error"]
    assert seen[400]["error"]  # the parser's reason
    for item in seen.values():
        assert item["kind"] == "local"
        assert item["client"].startswith("127.0.0.1:")
        assert item["bytes_out"] >= 0
