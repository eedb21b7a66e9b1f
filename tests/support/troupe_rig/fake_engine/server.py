"""Entry point: parse llama-server's command line, then serve like it does.

Order of events mirrors the pinned engine (tools/server/server.cpp): HTTP is up
before the model loads (so ``/health`` answers 503 meanwhile); signal handlers
and, in child mode, the stdin watcher start only once the model has loaded;
``ready`` is sent after the stdin watcher started.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from troupe_rig.fake_engine.app import FakeApp
from troupe_rig.fake_engine.config import ALL_OPTIONS, FakeConfig, load_config
from troupe_rig.fake_engine.options import render_help
from troupe_rig.fake_engine.protocol import CMD_EXIT, CommandChannel, is_child, log, srv
from troupe_rig.fake_engine.responses import VERSION
from troupe_rig.fake_engine.state import EngineState, die

if TYPE_CHECKING:
    from hypercorn.typing import ASGIFramework

__all__ = ["main", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    if cfg.show_help:
        sys.stdout.write(render_help(ALL_OPTIONS))
        return 0
    if cfg.show_version:
        # Like llama_print_build_info: on stderr.
        sys.stderr.write(f"version: {VERSION} (build 0, commit fake)\nbuilt with fake for Linux\n")
        return 0
    # Until the model has loaded, the real engine has no signal handlers: a signal kills it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if cfg.ignore_sigterm:
        signal.signal(signal.SIGTERM, _ignore_sigterm)
    channel = CommandChannel.reserve(is_child())
    return trio.run(run, cfg, channel)


def _ignore_sigterm(signum: int, frame: object) -> None:
    # Logged, so a test can wait for the signal to have arrived instead of sleeping.
    log("fake: ignoring SIGTERM", "W")


def _hypercorn_config(cfg: FakeConfig) -> Config:
    config = Config()
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    config.bind = [f"{host}:{cfg.port}"]
    config.accesslog = None
    config.loglevel = "WARNING"  # no "Running on ..." banner; llama-style lines only
    config.graceful_timeout = 0.5
    config.include_server_header = False  # the app sends "Server: llama.cpp" itself
    return config


async def run(cfg: FakeConfig, channel: CommandChannel) -> int:
    srv("llama_server", "initializing ...")
    if cfg.ignored:
        log(f"fake: ignoring unsupported arguments: {' '.join(cfg.ignored)}", "W")
    state = EngineState(cfg, channel)
    served = trio.Event()

    async def serve_http(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            app = cast("ASGIFramework", FakeApp(state))
            await serve(app, _hypercorn_config(cfg), mode="asgi",
                        shutdown_trigger=state.stopping.wait, task_status=task_status)  # fmt: skip
        finally:
            served.set()

    async with trio.open_nursery() as nursery:
        urls: list[str] = []
        try:
            urls = await nursery.start(serve_http)
        except* OSError as group:
            srv("llama_server", f"couldn't bind HTTP server socket: {group.exceptions[0]}", "E")
        if not urls:
            srv("llama_server", "exiting due to HTTP server error", "E")
            return 1
        await state.load()
        for url in urls:
            srv("llama_server", f"listening on {url}")
        nursery.start_soon(_watch_signals, state)
        if channel.active:
            nursery.start_soon(_watch_stdin, state)
            channel.notify("ready", state.info)
        if cfg.sleep_idle > 0:
            nursery.start_soon(state.sleep_when_idle)
        await state.stopping.wait()
        srv("operator()", "operator(): cleaning up before exit...")
        await trio.sleep(cfg.shutdown_time)
        await served.wait()
        nursery.cancel_scope.cancel()
    return 0


async def _watch_signals(state: EngineState) -> None:
    signals = {signal.SIGINT} if state.cfg.ignore_sigterm else {signal.SIGINT, signal.SIGTERM}
    with trio.open_signal_receiver(*signals) as received:
        async for _ in received:
            if state.stopping.is_set():
                log("Received second interrupt, terminating immediately.")
                die(1)
            state.stopping.set()


async def _read_line(buffer: bytearray) -> bytes:
    """One line of stdin (b"" at EOF), read in a thread so no fd goes non-blocking."""
    while b"\n" not in buffer:
        chunk = await trio.to_thread.run_sync(os.read, 0, 4096, abandon_on_cancel=True)
        if not chunk:
            line = bytes(buffer)
            buffer.clear()
            return line
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line + b"\n"


async def _watch_stdin(state: EngineState) -> None:
    """``server_child::setup``: the exit command stops us; EOF means the router died."""
    srv("operator()", "child server monitoring thread started, waiting for EOF on stdin...")
    buffer = bytearray()
    while True:
        line = await _read_line(buffer)
        if not line:
            srv("operator()", "EOF on stdin detected, forcing shutdown...")
            die(1)
        if CMD_EXIT in line.decode("utf-8", "replace"):
            if state.cfg.ignore_exit:
                srv("operator()", "fake: ignoring the exit command", "W")
                continue
            srv("operator()", "exit command received, exiting...")
            state.stopping.set()
            return
