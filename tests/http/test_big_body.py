"""A large JSON body is routed by its top-level ``model`` found without parsing the
document (``json.loads`` of 100 MB of small numbers held the GIL for
seconds, stalling every client). Over real sockets, the fake engine behind; the delay
another client sees is measured in ``bench/big_body.py``."""

from __future__ import annotations

import json

import trio

from troupe.http.body_model import OFF_LOOP_BYTES
from troupe_rig.router import RouterFactory

PAD = b"[" + b"1," * (4 << 20) + b'[2,{"model":"inner"}]]'  # 8 MiB of small numbers


async def test_a_large_body_is_routed_by_its_last_top_level_model(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}, "b": {}}) as router, router.client(timeout=120) as http:
        body = b'{"model":"b","content":"hello","pad":' + PAD + b',"mod\\u0065l" : "a"}'
        assert len(body) > OFF_LOOP_BYTES
        resp = await http.post("/tokenize", content=body)
        assert resp.status_code == 200, resp.text[:200]
        assert resp.json()["tokens"]
        assert router.status("a") == "loaded"  # the last "model" key counts, as json.loads
        assert router.status("b") == "unloaded"


async def test_a_large_body_that_is_not_json_is_a_400(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client(timeout=120) as http:
        for body, why in (
            (b'{"model":"a","pad":' + PAD, "Expecting ',' delimiter"),
            (b'{"model":"a","pad":' + PAD + b"} trailing", "Extra data"),
            (b'{"model":"a","pad":"\xff' + PAD + b'"}', "not valid UTF-8 (byte 20)"),
        ):
            resp = await http.post("/v1/completions", content=body)
            assert resp.status_code == 400
            error = resp.json()["error"]
            assert why in error["message"], error
            assert error["type"] == "invalid_request_error"
        assert router.snapshot.running == 0


async def test_health_answers_while_a_large_body_is_scanned(fake_router: RouterFactory) -> None:
    """Not a timing (bench/big_body.py measures it): /health is answered while one
    client's 40 MB body is taken in and scanned, and that request is still served."""
    async with fake_router({"a": {}}) as router, router.client(timeout=120) as http:
        body = b'{"pad":[' + b",".join([PAD] * 5) + b'],"model":"a","content":"x"}'
        done = trio.Event()
        answers: list[int] = []

        async def big() -> None:
            resp = await http.post("/tokenize", content=body)
            answers.append(resp.status_code)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(big)
            health = 0
            while not done.is_set():
                resp = await http.get("/health")
                assert resp.status_code == 200
                assert json.loads(resp.content) == {"status": "ok"}
                health += 1
        assert answers == [200]
        assert health >= 1
