"""Access records beyond the proxied routes, with real clients and the real
engine: one per router-local request (kind "local", a ring of their own, so a polling
dashboard cannot push the model traffic out) and one per ``/v1/realtime`` session at
its end (kind "realtime": model, duration, close code, tokens)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from troupe.ops.access import AccessRecord
from troupe_rig.realtime_client import EventLog, run_asyncio, sdk_client
from troupe_rig.router import RouterFactory

pytestmark = pytest.mark.engine


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[AccessRecord]:
    return [r.access for r in caplog.records if r.name == "troupe.access"]  # type: ignore[attr-defined]


async def test_local_routes_get_records_probes_that_answer_do_not(
    real_router: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="troupe.access")
    async with real_router("--access-log", "on") as router, router.client() as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/v1/models")).status_code == 200
        assert (await http.post("/models/load", json={"model": "tiny"})).status_code == 200
        assert (await http.post("/models/load", json={"model": "nope"})).status_code == 404
        assert (await http.get("/troupe/version")).status_code == 200
        await router.ctx.requests.wait_until(lambda r: r.path == "/troupe/version")

        local = (await http.get("/troupe/requests", params={"kind": "local"})).json()["data"]
        seen = [(r["method"], r["path"], r["status"], r["model"]) for r in local]
        assert seen == [  # newest first; /health and /metrics answered well: no record
            ("GET", "/troupe/version", 200, ""),
            ("POST", "/models/load", 404, "nope"),
            ("POST", "/models/load", 200, "tiny"),
            ("GET", "/v1/models", 200, ""),
        ]
        assert all(r["kind"] == "local" and r["bytes_out"] > 0 for r in local)
        assert local[2]["bytes_in"] == len(b'{"model":"tiny"}')
        # The model traffic's view (the default, what the dashboard shows) holds none.
        assert (await http.get("/troupe/requests")).json()["data"] == []
        everything = (await http.get("/troupe/requests", params={"kind": "all"})).json()["data"]
        assert [r["path"] for r in everything][-4:] == [r["path"] for r in local][-4:]
        bad = await http.get("/troupe/requests", params={"kind": "nonsense"})
        assert bad.status_code == 400
        assert "kind must be" in bad.json()["error"]["message"]
        metrics = (await http.get("/metrics")).text
        await router.ctx.requests.wait_until(lambda r: r.status == 404 and r.kind == "local")

    lines = _access_lines(caplog)
    assert "/health" not in [r.path for r in lines]
    assert "/metrics" not in [r.path for r in lines]
    load = next(r for r in lines if r.path == "/models/load" and r.status == 200)
    assert "kind=local" in load.text()
    # The request metrics count proxied requests only.
    assert 'route="/models/load"' not in metrics


def _user(text: str) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


async def test_one_record_per_realtime_session_at_its_end(
    real_router: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario(url: str) -> int:
        async with sdk_client(url).realtime.connect(model="tiny") as conn:
            log = EventLog(conn)
            await log.until("session.created")
            for text in ("hello", "more"):
                await log.send(_user(text))
                await log.until("conversation.item.done")
                await log.send({"type": "response.create", "response": {"max_output_tokens": 4}})
                done = await log.until("response.done")
        return int(done[-1].response.usage.input_tokens)

    async def refused(url: str) -> int:
        try:
            async with sdk_client(url).realtime.connect(model="no-such-model"):
                pass
        except InvalidStatus as exc:
            return exc.response.status_code
        return 0

    caplog.set_level(logging.INFO, logger="troupe.access")
    async with real_router("--access-log", "on") as router, router.client() as http:
        last_prompt = await run_asyncio(scenario, router.url)
        rec = await router.ctx.requests.wait_until(lambda r: r.kind == "realtime")
        assert (rec.model, rec.status, rec.close_code) == ("tiny", 101, 1000)
        assert rec.completion_tokens == 8  # two responses of 4
        assert rec.prompt_tokens is not None
        assert rec.prompt_tokens > last_prompt  # both turns' prompts
        assert rec.duration > 0
        assert rec.bytes_in > 0
        assert rec.bytes_out > rec.bytes_in
        assert rec.client.startswith("127.0.0.1:")
        assert rec.path == "/v1/realtime"

        assert await run_asyncio(refused, router.url) == 400
        no = await router.ctx.requests.wait_until(lambda r: r.model == "no-such-model")
        assert (no.kind, no.status, no.close_code) == ("realtime", 400, None)
        assert no.error is not None
        assert "no-such-model" in no.error

        ring = (await http.get("/troupe/requests", params={"model": "tiny"})).json()["data"]
        assert [(r["kind"], r["close_code"]) for r in ring] == [("realtime", 1000)]
        # Each response's wait went through the one lease (`troupe.lease`): counted as
        # an HTTP request's is.
        metrics = (await http.get("/metrics")).text
        assert 'troupe_queue_wait_seconds_count{model="tiny",outcome="granted"} 2.0' in metrics

    line = next(r for r in _access_lines(caplog) if r.kind == "realtime" and r.status == 101)
    assert "kind=realtime close=1000" in line.text()
    assert "tokens=" in line.text()
