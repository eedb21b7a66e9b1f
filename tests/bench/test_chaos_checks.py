"""The chaos harness's checks can fail: planted orphans, leaked descriptors, hung and
doubled answers, cut streams and connections left open are all caught."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from _util import start_process
from chaos import client as cl
from chaos import invariants as inv
from chaos.procs import TAG_VAR, fd_count
from chaos.routers import TROUPE, Launch, Router

# A stand-in router: one child that keeps running, and 20 descriptors more on SIGUSR1.
FAKE_ROUTER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
leaked = []
signal.signal(signal.SIGUSR1, lambda *a: leaked.extend(open(os.devnull) for _ in range(20)))
print("ready", child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    tag = f"test-{os.getpid()}-{time.monotonic_ns()}"
    r = Router(TROUPE, Launch(), engine=Path(sys.executable), mixed=Path(sys.executable),
               workdir=tmp_path, tag=tag)  # fmt: skip
    env = {**os.environ, TAG_VAR: tag}
    r.proc = start_process("fake-router", [sys.executable, "-c", FAKE_ROUTER], tmp_path, env)
    deadline = time.monotonic() + 30
    while b"ready" not in r.proc.log.read_bytes():
        assert time.monotonic() < deadline, r.proc.tail()
        time.sleep(0.01)
    r.tracker.start(r.pid)
    r.tracker.sample()
    yield r
    r.close()


def test_a_child_left_running_and_an_orphan_are_reported(router: Router, tmp_path: Path) -> None:
    env = {**os.environ, TAG_VAR: router.tag}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        found = inv.leftovers(router)
        assert any(f.startswith("still running after unload") for f in found), found
        assert any(f.startswith("orphans") and str(orphan.pid) in f for f in found), found
    finally:
        orphan.kill()
        orphan.wait()


def test_nothing_is_reported_once_everything_is_gone(router: Router) -> None:
    for seen in router.tracker.all():
        os.kill(seen.pid, signal.SIGKILL)
    time.sleep(0.2)  # the stand-in router reaps nothing: its dead child is a zombie
    found = inv.leftovers(router)
    assert found == ["1 unreaped zombie children"], found


def test_a_descriptor_leak_is_reported(router: Router) -> None:
    base = inv.baseline(router)
    assert inv.resources(base, router.fds(), router.rss()) == []
    os.kill(router.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while fd_count(router.pid) < base.fds + 20:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    found = inv.resources(base, router.fds(), router.rss())
    assert found == [f"descriptors {base.fds} -> {base.fds + 20}"], found


def test_troupe_facts_report_leftover_requests() -> None:
    models = {
        "a": {"status": {"value": "unloaded"}, "troupe": {"in_flight": 1, "waiting": 0}},
        "b": {"status": {"value": "loaded"}, "troupe": {"in_flight": 3}},  # running: fine
        "c": {"status": {"value": "unloaded"}, "troupe": {"queue_position": 2}},
    }
    assert inv.troupe_facts(models) == [  # type: ignore[arg-type]
        "a: in_flight=1 while unloaded",
        "c: queue_position=2 while unloaded",
    ]


def test_the_ledger_reports_hung_and_disallowed_answers() -> None:
    ledger = inv.Ledger()
    ledger.add("g", cl.Answer(cl.OK, 200))
    ledger.add("g", cl.Answer(cl.ERROR, 500, body=b'{"error": {"message": "boom"}}'))
    ledger.add("g", cl.Answer(cl.HUNG, elapsed=5.0))
    assert ledger.violations("g", [cl.OK]) == ["g: 1 error 500 (boom)"]
    assert ledger.never() == ["g: 1 hung (after 5.0 s)"]
    assert ledger.violations("g", [cl.OK, cl.ERROR]) == []


# --- the raw client, against servers that misbehave ------------------------------------------

Handler = Callable[[trio.SocketStream], Awaitable[None]]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def ask(handler: Handler, bound: float = 2.0) -> cl.Answer:
    async def serve(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await handler(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        wire = cl.request_bytes("GET", "/", None)
        got = await cl.exchange(("127.0.0.1", port), wire, bound=bound)
        nursery.cancel_scope.cancel()
    return got


async def test_an_answer_and_a_close_is_ok() -> None:
    async def once(stream: trio.SocketStream) -> None:
        await stream.send_all(HEAD)
        await stream.aclose()

    got = await ask(once)
    assert (got.kind, got.status, got.server_closed) == (cl.OK, 200, True)


async def test_a_connection_left_open_is_seen() -> None:
    async def open_(stream: trio.SocketStream) -> None:
        await stream.send_all(HEAD)
        await trio.sleep_forever()

    got = await ask(open_)
    assert (got.kind, got.server_closed) == (cl.OK, False)


async def test_a_second_answer_is_double() -> None:
    async def twice(stream: trio.SocketStream) -> None:
        await stream.send_all(HEAD + HEAD)
        await stream.aclose()

    got = await ask(twice)
    assert got.kind == cl.DOUBLE, got


async def test_no_answer_is_hung() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    got = await ask(silent, bound=0.5)
    assert got.kind == cl.HUNG, got


async def test_a_stream_cut_or_ended_by_an_error_event() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def cut(stream: trio.SocketStream) -> None:
        await stream.send_all(head + chunk(b"data: {}\n\n"))
        await stream.aclose()

    async def error_event(stream: trio.SocketStream) -> None:
        event = b'data: {"error": {"message": "gone"}}\n\n'
        await stream.send_all(head + chunk(b"data: {}\n\n") + chunk(event) + b"0\r\n\r\n")
        await stream.aclose()

    assert (await ask(cut)).kind == cl.TRUNCATED
    got = await ask(error_event)
    assert (got.kind, got.error_message()) == (cl.STREAM_ERROR, "gone")
