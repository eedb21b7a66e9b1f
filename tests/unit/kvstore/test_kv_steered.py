"""`KvService.steered` on requests it must leave alone, over a real socket that records
whether the store asked the child anything."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from troupe.kvstore import KvService, KvStore
from troupe.kvstore.service import tokens_held, with_slot
from troupe.proxy.upstream import UpstreamPool


@pytest.mark.parametrize(
    "request_",
    [
        {"model": "m", "prompt": ["one story", "another story"]},  # two tasks
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2},
    ],
)
async def test_a_request_the_engine_runs_as_several_tasks_is_not_held_on_a_slot(
    tmp_path: Path, request_: dict[str, object]
) -> None:
    kv = KvService(KvStore(tmp_path / "kv", 1 << 30), children=UpstreamPool())
    kv.launch_args("m", ["llama-server", "--model", "m.gguf"], swa=False)
    asked: list[bytes] = []

    async def child(stream: trio.SocketStream) -> None:
        asked.append(await stream.receive_some())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, child, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        kv.api.pool.started("m", 1, port)
        body = json.dumps(request_).encode()
        path = "/v1/completions" if "prompt" in request_ else "/v1/chat/completions"
        async with kv.steered("m", 1, path, body) as hold:
            assert (hold.slot, hold.body) == (None, body)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert asked == []  # not even its slots were read


@pytest.mark.parametrize(
    ("body", "spliced"),
    [
        (b'{"model": "m", "prompt": "a \\u00e9 story"}', True),
        (b'\n  {"model": "m"}  ', True),
        (b"{}", True),
        (b'{"model": "m", "id_slot": -1}', False),  # its own -1 would win over ours
        ('\ufeff{"model": "m"}'.encode(), False),  # a BOM first
        ('{"model": "m"}'.encode("utf-16-le"), False),  # Python reads it; not UTF-8
    ],
)
def test_the_slot_goes_in_the_client_s_own_bytes_when_they_are_plain_utf8(
    body: bytes, spliced: bool
) -> None:
    request = json.loads(body)
    sent = with_slot(body, request, 3)
    assert json.loads(sent) == {**request, "id_slot": 3}
    # Spliced: everything after its opening brace is as the client sent it.
    rest = body[body.index(b"{") + 1 :]
    assert sent.endswith(rest) == spliced


@pytest.mark.parametrize(
    ("answer", "held"),
    [
        # A whole answer, and a stream's last event: cached + evaluated + predicted.
        (b'{"usage":{"prompt_tokens":136},"timings":{"cache_n":135,"prompt_n":1,'
         b'"prompt_ms":0.5,"predicted_n":4}}', 140),
        (b'data: {"choices":[],"timings":{"cache_n":0,"prompt_n":59,"predicted_n":4}}\n\n'
         b"data: [DONE]\n\n", 63),
        (b'{"usage":{"prompt_tokens":136,"completion_tokens":4}}', None),  # no timings
        (b'{"timings":{"prompt_n":59,"predicted_n":4}}', None),  # not all three
        (b'{"timings":{"cache_n":true,"prompt_n":59,"predicted_n":4}}', None),
        (b'"timings": {"cache_n": 1, "prompt', None),  # cut
    ],
)  # fmt: skip
def test_a_slot_s_size_is_read_from_the_answer_s_timings(answer: bytes, held: int | None) -> None:
    assert tokens_held(answer) == held
