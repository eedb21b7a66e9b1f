"""Scraping the children's own /metrics: through the relay's pool, keyed by generation,
bounded per child, over real sockets."""

from __future__ import annotations

from functools import partial

import trio
import trio.testing

from troupe.ops.children import scrape_children
from troupe.proxy.upstream import UpstreamPool

METRICS = b"# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 7\n"


async def child_server(nursery: trio.Nursery, *, silent: bool = False) -> tuple[int, list[bytes]]:
    """A stand-in child answering ``GET /metrics`` (keep-alive); the request lines seen."""
    seen: list[bytes] = []

    async def on_connection(stream: trio.SocketStream) -> None:
        async with stream:
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                seen.append(head.split(b"\r\n", 1)[0])
                if silent:
                    await trio.sleep_forever()
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(METRICS), METRICS)
                )

    listeners = await nursery.start(partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1], seen


async def test_a_running_child_is_scraped_through_the_pool_and_labelled() -> None:
    async with trio.open_nursery() as nursery:
        port, seen = await child_server(nursery)
        pool = UpstreamPool()
        pool.started("m", 3, port, 2)  # the scheduler: generation 3 of m started on port
        for _ in range(2):
            families, up = await scrape_children(pool, ["m"])
            assert up == {"m": True}
            (family,) = families["m"]
            assert family.name == "llamacpp:tokens_predicted"
            assert family.samples[0].value == 7
        assert seen == [b"GET /metrics HTTP/1.1"] * 2
        assert pool.open_count == 1  # one pooled connection, reused
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_child_known_to_be_gone_is_not_asked() -> None:
    async with trio.open_nursery() as nursery:
        port, seen = await child_server(nursery)
        pool = UpstreamPool()
        pool.started("m", 1, port, 2)
        pool.forget("m", 1)  # stopping: not asked (and once gone, its port is anyone's)
        families, up = await scrape_children(pool, ["m", "never-started"])
        assert (families, up) == ({}, {"m": False, "never-started": False})
        assert seen == []
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_silent_child_costs_the_scrape_its_bound_and_no_more() -> None:
    async with trio.open_nursery() as nursery:
        slow, _ = await child_server(nursery, silent=True)
        fast, _ = await child_server(nursery)
        pool = UpstreamPool()
        pool.started("slow", 1, slow, 2)
        pool.started("fast", 1, fast, 2)
        with trio.fail_after(10):  # a hang guard: the silent child is cut at `each`
            families, up = await scrape_children(pool, ["slow", "fast"], each=0.3)
        assert up == {"slow": False, "fast": True}
        assert list(families) == ["fast"]
        assert pool.open_count == 1  # the cut answer's connection was closed, not pooled
        await pool.aclose()
        nursery.cancel_scope.cancel()
