"""A gray failure behind real HAProxy: a node that hangs (SIGSTOP) instead of dying.

Three ``troupe serve`` nodes with the real engine, a cluster secret and
``--cluster-timeout 1``. While tiny-b's home is stopped, nothing waits on it past the
timeouts: a request another node forwards to it goes on to the next node once its
health check goes unanswered, and the balancer takes it out (``timeout check``) and
routes tiny-b to its next node. Continued, the home serves again, and the copy its
successor made is given back once idle (``--cluster-copy-ttl``).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import httpx2
import openai
import pytest
import trio

from troupe_rig.cluster_sdk import chat, client, cluster, write_catalogs

BOUND = 30.0  # seconds: far past the timeouts (1 s checks of the node, 2 s of HAProxy)


@pytest.fixture
def catalogs(tmp_path: Path) -> list[Path]:
    return write_catalogs(tmp_path)


async def test_a_stopped_home_hangs_no_request_and_serves_again_once_continued(
    tmp_path: Path, catalogs: list[Path], haproxy_path: Path
) -> None:
    extra = ["--cluster-timeout", "1", "--cluster-copy-ttl", "1"]
    async with cluster(tmp_path, catalogs, haproxy_path, extra=extra) as stack:
        home, successor = stack.order("tiny-b")[:2]
        forwarder = next(n for n in stack.nodes if n is not home)
        node, text = await trio.to_thread.run_sync(chat, stack.url, "tiny-b")
        assert (node, bool(text)) == (home.name, True)
        assert home.process is not None
        pid = home.process.process.pid
        body = {"model": "tiny-b", "prompt": "hello", "max_tokens": 4}
        async with httpx.AsyncClient(timeout=BOUND) as http:
            # The forwarder's view of its peers is fresh from this one (forwarded home),
            # so the next is forwarded home at once, not after a refresh that times out.
            resp = await http.post(forwarder.url + "/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            os.kill(pid, signal.SIGSTOP)
        try:
            # A client of another node: that node forwards tiny-b to its (hung) home,
            # finds the home's health check unanswered, and goes on to the next node
            # (itself, or the successor), since no byte had reached the client.
            with trio.fail_after(BOUND):
                async with httpx.AsyncClient(timeout=BOUND) as http:
                    resp = await http.post(forwarder.url + "/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["text"] is not None

            # The balancer takes the home out and sends tiny-b to its next node, or to
            # a node where it is already warm (the forwarder, if it served the request
            # above itself): the agent check prefers a warm copy to a cold load.
            await stack.wait_status(home.name, "DOWN", within=BOUND)
            warm = set(await stack.loaded_on("tiny-b", skip=[home.name]))
            with trio.fail_after(BOUND):
                node, text = await trio.to_thread.run_sync(chat, stack.url, "tiny-b")
            assert (node in {successor.name, *warm}, bool(text)) == (True, True), (node, warm)
        finally:
            os.kill(pid, signal.SIGCONT)

        # Continued: its health check passes, and its model returns to it.
        await stack.wait_status(home.name, "UP", within=BOUND)
        with trio.fail_after(BOUND):
            node, text = await trio.to_thread.run_sync(chat, stack.url, "tiny-b")
        assert (node, bool(text)) == (home.name, True)

        # The copies made while the home was out are given back once idle
        # (--cluster-copy-ttl), now that the home is up; the home keeps its own.
        with trio.move_on_after(BOUND):
            while set(await stack.loaded_on("tiny-b")) - {home.name}:  # noqa: ASYNC110
                await trio.sleep(0.2)  # no event says so from outside the node
        left = set(await stack.loaded_on("tiny-b")) - {home.name}
        assert not left, (left, warm)
        assert home.name in await stack.loaded_on("tiny-b")

        # A stream another node relays from the home, which hangs half-way: once its
        # health check goes unanswered the relay ends with an error event, which the
        # SDK raises as the server's error (before: the stream was cut, a broken read).
        # The client reads on only once the home is stopped (until then the stream waits
        # on it: the tiny model would otherwise finish it in seconds).
        # The forwarder's own view of the home is back too (it left the home out for a
        # while after the hang): its forwards reach the home again.
        with trio.fail_after(BOUND):
            async with httpx.AsyncClient(timeout=BOUND) as http:
                while True:
                    resp = await http.post(forwarder.url + "/v1/completions", json=body)
                    if resp.headers.get("x-troupe-node") == home.name:
                        break
                    await trio.sleep(0.2)
        first, go = trio.Event(), threading.Event()
        ended: list[tuple[str, BaseException | None]] = []

        async def relayed() -> None:
            ended.append(
                await trio.to_thread.run_sync(_paused_stream, forwarder.url, "tiny-b", first, go)
            )

        try:
            with trio.fail_after(BOUND):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(relayed)
                    await first.wait()
                    os.kill(pid, signal.SIGSTOP)
                    go.set()
        finally:
            go.set()
            os.kill(pid, signal.SIGCONT)
        (served, error), *_ = ended
        assert served == home.name
        assert isinstance(error, openai.APIError), repr(error)
        assert not isinstance(error, openai.APIConnectionError), repr(error)
        assert f"node {home.name} stopped answering" in str(error)


def _paused_stream(
    url: str, model: str, first: trio.Event, go: threading.Event
) -> tuple[str, BaseException | None]:
    """A long stream through the SDK: (the node that served it, what ended it: None when
    it ended normally); after its first chunk it sets ``first`` and reads on once ``go``
    is set."""
    with (
        client(url) as sdk,
        sdk.completions.with_streaming_response.create(
            model=model,
            prompt="hi",
            max_tokens=30000,
            stream=True,
            extra_body={"ignore_eos": True},
        ) as resp,
    ):
        node = resp.headers.get("x-troupe-node", "")
        if not node:
            return node, None  # served by the node asked, not relayed: not this case
        try:
            for _ in resp.parse():
                if not first.is_set():
                    trio.from_thread.run_sync(first.set)
                    go.wait(BOUND)
        except (openai.APIError, httpx.HTTPError, httpx2.HTTPError) as exc:
            return node, exc
    return node, None
