"""The dashboard's files and the log stream over HTTP: what is public, what needs the key,
bad input, and streams that end when the router stops."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from pathlib import Path

import trio

from troupe.ops.dashboard import load_static
from troupe_rig.router import RouterFactory

STATIC = Path(__file__).resolve().parents[2] / "src" / "troupe" / "ops" / "static"


def test_vendored_files_match_their_record() -> None:
    record = (STATIC / "vendor" / "README.txt").read_text()
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        digest = hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest()
        assert digest in record, name
    assert (
        (STATIC / "vendor" / "uPlot.iife.min.js")
        .read_text()
        .startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    )
    assert "MIT License" in (STATIC / "vendor" / "uPlot.LICENSE.txt").read_text()


async def test_the_page_and_its_files_are_public_and_the_data_is_not(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-key", "k") as router, router.client() as http:
        resp = await http.get("/troupe")
        assert resp.status_code == 308
        assert resp.headers["location"] == "/troupe/"
        page = await http.get("/troupe/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        files = load_static()
        referenced = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert referenced
        for name in referenced:
            assert name in files, name
            resp = await http.get(f"/troupe/{name}")
            assert resp.status_code == 200, name
            assert resp.content == files[name]
            again = await http.get(
                f"/troupe/{name}", headers={"if-none-match": resp.headers["etag"]}
            )
            assert again.status_code == 304
        assert (
            (await http.get("/troupe/dashboard.js"))
            .headers["content-type"]
            .startswith("text/javascript")
        )
        missing = await http.get("/troupe/%2e%2e/pyproject.toml")  # only the files it ships
        assert missing.status_code == 404
        assert (await http.get("/troupe/nope.js")).json()["error"]["type"] == "not_found_error"
        # Everything with data needs the key, and a POST under /troupe/ is no way around it.
        for path in ("/models", "/logs/stream", "/metrics"):
            assert (await http.get(path)).status_code == 401, path
        assert (await http.post("/troupe/index.html")).status_code == 401


async def test_log_stream_bad_input(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"alias": "first"}}) as router, router.client() as http:
        resp = await http.get("/logs/stream", params={"model": "zzz"})
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "model 'zzz' not found"
        resp = await http.get("/logs/stream", params={"model": "a", "lines": "many"})
        assert resp.status_code == 400
        assert resp.json()["error"]["type"] == "invalid_request_error"


async def test_log_stream_history_limits_aliases_and_the_end_at_shutdown(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"alias": "first"}}) as router, router.client() as http:
        with router.ctx.logs.subscribe("a") as log, trio.fail_after(30):
            assert (await http.post("/models/load", json={"model": "a"})).status_code == 200
            while not any("model loaded" in ln.text for ln in (await log.receive())[0]):
                pass
        kept = router.ctx.logs.recent("a")
        params = {"model": "first", "lines": "2"}  # an alias names the model
        async with http.stream("GET", "/logs/stream", params=params) as resp:
            assert resp.headers["x-accel-buffering"] == "no"
            text = ""
            async for chunk in resp.aiter_text():
                text += chunk
                if text.count("\n\n") >= 2:
                    break
        got = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: ")]
        assert len(got) == 2
        by_seq = {ln.seq: ln.to_json() for ln in router.ctx.logs.recent("a")}
        assert got == [by_seq[got[0]["seq"]], by_seq[got[1]["seq"]]]
        assert got[0]["seq"] >= kept[-2].seq  # the last two lines, not the first ones
        async with (
            http.stream("GET", "/logs/stream", params={"no-history": ""}) as resp,
            contextlib.aclosing(resp.aiter_text()) as chunks,
        ):
            assert await anext(chunks) == ": no history\n\n"
            # The router starts to stop: the stream ends rather than waiting to be cut.
            router.ctx.http_stop.set()
            assert [chunk async for chunk in chunks] == []
