"""One KV owner per child generation, and every call to a child through the one transport
keyed by (model, generation), over real sockets to a stand-in engine: a call meant for a
child that was replaced on the same port never reaches the new one, the save before a
stop still goes to the stopping child, and the owner lives from the child's start to its
exit."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.testing

from troupe.kvstore import KvService, KvStore
from troupe.proxy.upstream import UpstreamPool

PROMPT = "a long enough prompt " * 40
BODY = json.dumps({"model": "m", "prompt": PROMPT}).encode()


class Engine:
    """Answers the store's calls as the engine does (two slots, one of which served);
    records each request line; ``GET /slots`` waits for ``gate`` when one is set."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.gate: trio.Event | None = None

    async def serve(self, stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        head = data.partition(b"\r\n\r\n")[0]
        method, path = head.split(b" ")[:2]
        self.asked.append(f"{method.decode()} {path.decode()}")
        answer: Any = {}
        if path == b"/slots":
            if self.gate is not None:
                await self.gate.wait()
            answer = [{"id": 0, "id_task": 3}, {"id": 1}]
        out = json.dumps(answer).encode()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (len(out), out)
        )
        await stream.aclose()


@asynccontextmanager
async def engine() -> AsyncIterator[tuple[Engine, int]]:
    fake = Engine()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, fake.serve, 0, host="127.0.0.1"))
        yield fake, listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


def service(tmp_path: Path) -> tuple[KvService, UpstreamPool]:
    pool = UpstreamPool()
    kv = KvService(KvStore(tmp_path / "kv", 1 << 30), children=pool)
    kv.launch_args("m", ["llama-server", "--model", "m.gguf"], swa=False)
    return kv, pool


async def test_a_kv_call_for_a_child_replaced_on_the_same_port_is_refused(tmp_path: Path) -> None:
    kv, pool = service(tmp_path)
    async with engine() as (fake, port):
        pool.started("m", 1, port)
        async with kv.steered("m", 1, "/completion", BODY) as hold:
            assert hold.slot is not None  # generation 1's map, read from its slots
        assert fake.asked == ["GET /slots"]
        # Generation 1 exits; generation 2 starts, and gets the very same port.
        pool.forget("m", 1)
        pool.gone("m", 1)
        kv.launch_args("m", ["llama-server", "--model", "m.gguf"], swa=False)
        pool.started("m", 2, port)
        # A late request still holding generation 1's lease, and generation 1's save.
        async with kv.steered("m", 1, "/completion", BODY) as hold:
            assert (hold.slot, hold.body) == (None, BODY)  # sent as it came, not steered
        await kv.save_slots("m", 1)
        assert fake.asked == ["GET /slots"]  # nothing of theirs reached generation 2
        assert kv.owner("m", 1) is None
        owner = kv.owner("m", 2)
        assert owner is not None
        assert owner.map is None  # the new child's map is its own, read on its first use
    await pool.aclose()


async def test_the_save_before_a_stop_reaches_the_stopping_child_and_nothing_else_does(
    tmp_path: Path,
) -> None:
    kv, pool = service(tmp_path)
    async with engine() as (fake, port):
        pool.started("m", 1, port)
        async with kv.steered("m", 1, "/completion", BODY):
            pass
        pool.forget("m", 1)  # the scheduler stops it: the relay's requests are refused
        async with kv.steered("m", 1, "/completion", BODY) as hold:
            assert hold.slot is None  # a stopping child's slots are claimed no more
        await kv.save_slots("m", 1)  # the stop's own save still goes (final)
        assert fake.asked[0] == "GET /slots"
        # The slot that served (the stand-in writes no file: nothing is stored).
        assert fake.asked[1:] == ["GET /slots", "POST /slots/0?action=save"]
        pool.gone("m", 1)
        before = list(fake.asked)
        await kv.save_slots("m", 1)  # once gone, not even a save
        assert fake.asked == before
    await pool.aclose()


async def test_the_owner_lives_from_the_child_s_start_to_its_exit(tmp_path: Path) -> None:
    kv, pool = service(tmp_path)
    assert kv.owner("m", 1) is None
    pool.started("m", 1, 1)
    owner = kv.owner("m", 1)
    assert owner is not None
    assert owner.child.port == 1
    pool.forget("m", 1)
    assert kv.owner("m", 1) is owner  # stopping: its save is still to come
    pool.gone("m", 1)
    assert kv.owner("m", 1) is None
    assert owner.gone
    # A model whose child the store leaves alone (one tenant, no files) gets none.
    other = KvService(None, children=pool)
    other.launch_args("n", ["llama-server"], swa=False)
    pool.started("n", 1, 2)
    assert other.owner("n", 1) is None
    await pool.aclose()


async def test_a_first_request_that_leaves_while_the_slots_are_read_leaves_the_map_whole(
    tmp_path: Path,
) -> None:
    kv, pool = service(tmp_path)
    async with engine() as (fake, port):
        fake.gate = trio.Event()
        pool.started("m", 1, port)
        got: list[int | None] = []

        async def second() -> None:
            async with kv.steered("m", 1, "/completion", BODY) as hold:
                got.append(hold.slot)

        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as first:

                async def leave() -> None:
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.start_soon(second)
                    await trio.testing.wait_all_tasks_blocked()
                    first.cancel()  # the client that asked first goes away
                    await trio.testing.wait_all_tasks_blocked()
                    assert fake.gate is not None
                    fake.gate.set()

                nursery.start_soon(leave)
                async with kv.steered("m", 1, "/completion", BODY):
                    await trio.sleep_forever()  # (its slot, if it got one, given back)
        assert len(got) == 1
        assert got[0] is not None  # steered, from the map the first request began to read
        assert fake.asked.count("GET /slots") == 1  # read once
    await pool.aclose()
