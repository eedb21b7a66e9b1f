"""The access log cannot be forged: a request's fields are escaped as nginx
escapes them (``\\xHH`` for '"', '\\\\', bytes under 0x20 and from 0x7f up), so a path
like ``/v1/models%0A<a forged line>`` stays on its one line; the JSON lines stay JSON.
Over real sockets, the lines as the access log's handler gets them."""

from __future__ import annotations

import json
import logging

import pytest

from troupe.ops.access import escape
from troupe.ops.logformat import JsonFormatter
from troupe_rig.router import RouterFactory
from troupe_rig.wire import exchange

FORGED = b"/v1/models%0A2030-01-01%2000:00:00,000%20INFO%20troupe.access:%20%22GET%20/admin%22"


def test_escape_is_nginx_s() -> None:
    assert escape("/v1/models") == "/v1/models"
    assert escape('a\nb"c\\d\x7f\x00') == "a\\x0Ab\\x22c\\x5Cd\\x7F\\x00"
    assert escape("café") == "caf\\xC3\\xA9"
    assert escape("\ud800") == "\\xED\\xA0\\x80"  # a lone surrogate (from JSON) too


async def test_a_newline_in_the_path_or_the_model_cannot_forge_a_line(
    fake_router: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="troupe.access")
    async with fake_router({"a": {}}, "--access-log", "on") as router:
        got = await exchange(
            router, b"GET %b HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % FORGED
        )
        assert got.startswith(b"HTTP/1.1 404 ")
        body = json.dumps({"model": 'a\nforged "line"', "prompt": "x"}).encode()
        wire = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        wire += b"Content-Type: application/json\r\n"
        wire += b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body)
        assert (await exchange(router, wire)).split(b" ", 2)[1] == b"400"
        await router.ctx.requests.wait_until(lambda r: r.path.startswith("/v1/completions"))
    # the writer flushes its pending batch (WRITE_EVERY) as the router stops
    lines = [r for r in caplog.records if r.name == "troupe.access"]
    texts = [r.getMessage() for r in lines]
    forged = next(t for t in texts if "/v1/models" in t)
    assert "\n" not in forged
    assert "/v1/models\\x0A2030-01-01 00:00:00,000 INFO troupe.access: \\x22GET /admin" in forged
    posted = next(t for t in texts if "/v1/completions" in t)
    assert "model=a\\x0Aforged \\x22line\\x22" in posted
    for record in lines:
        out = JsonFormatter().format(record)
        assert "\n" not in out
        assert json.loads(out)["message"] == record.getMessage()
