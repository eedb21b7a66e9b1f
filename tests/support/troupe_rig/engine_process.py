"""Run one engine process (real ``llama-server`` or the fake) the way a router does.

`open_engine` starts it with piped stdin/stdout/stderr (child mode by default),
collects its state lines and log lines as they arrive, and lets a test wait on
them instead of sleeping. Leaving the block kills whatever is still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from troupe_rig.reaper import guard

__all__ = ["EngineExited", "EngineProcess", "free_port", "open_engine"]

STATE_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = b"cmd_router_to_child:exit\n"
_LISTENING = re.compile(r"listening on (http://\S+)")


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out (what the C++ router does; a small race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@attrs.define(eq=False)
class EngineProcess:
    """A running engine and everything it said so far."""

    process: trio.Process
    states: list[tuple[str, object]] = attrs.field(factory=list)  # (state, payload), in order
    stdout_lines: list[str] = attrs.field(factory=list)  # stdout lines that are not state lines
    stderr_lines: list[str] = attrs.field(factory=list)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _eof: int = 0  # pipes that reached EOF

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def stderr_text(self) -> str:
        return "\n".join(self.stderr_lines)

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_for(self, check: Callable[[], bool]) -> None:
        while not check():
            if self._eof == 2:
                raise EngineExited(self.process.returncode, self.stderr_text)
            await self._changed.wait()

    async def wait_state(self, state: str, start: int = 0) -> object:
        """Payload of the first ``state`` line at or after index ``start`` of `states`."""

        def found() -> bool:
            return any(s == state for s, _ in self.states[start:])

        await self._wait_for(found)
        return next(p for s, p in self.states[start:] if s == state)

    async def wait_log(self, pattern: str) -> re.Match[str]:
        """The first stderr line matching the regex ``pattern``."""
        rx = re.compile(pattern)

        def found() -> bool:
            return any(rx.search(line) for line in self.stderr_lines)

        await self._wait_for(found)
        return next(m for line in self.stderr_lines if (m := rx.search(line)))

    async def url(self) -> str:
        """Base URL from the engine's ``listening on`` line (logged once it is ready)."""
        return (await self.wait_log(_LISTENING.pattern)).group(1)

    async def send_exit(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(EXIT_COMMAND)

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    def signal(self, sig: int) -> None:
        if self.process.returncode is None:
            self.process.send_signal(sig)

    async def wait(self) -> int:
        """Exit code, after both output pipes are drained."""
        code = await self.process.wait()
        while self._eof < 2:
            await self._changed.wait()
        return code


class EngineExited(Exception):
    """The engine closed its pipes while a test was waiting for something else."""

    def __init__(self, code: int | None, stderr: str) -> None:
        super().__init__(f"engine exited (code {code}); stderr tail:\n{stderr[-2000:]}")
        self.code = code


async def _read_lines(stream: trio.abc.ReceiveStream, sink: EngineProcess, err: bool) -> None:
    buffer = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            _take_line(sink, raw.decode("utf-8", "replace"), err)
        sink._poke()
    if buffer:
        _take_line(sink, buffer.decode("utf-8", "replace"), err)
    sink._eof += 1
    sink._poke()


def _take_line(sink: EngineProcess, line: str, err: bool) -> None:
    if err:
        sink.stderr_lines.append(line)
    elif line.startswith(STATE_PREFIX):
        data = json.loads(line[len(STATE_PREFIX) :])
        sink.states.append((data["state"], data.get("payload")))
    else:
        sink.stdout_lines.append(line)


@asynccontextmanager
async def open_engine(
    argv: Sequence[str],
    *,
    child: bool = True,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[EngineProcess]:
    """Start ``argv`` with pipes; in child mode ``LLAMA_SERVER_ROUTER_PORT`` is set.

    The process gets its own session (as troupe starts children), and is killed
    with its group on the way out if it is still running.
    """
    full_env = dict(os.environ)
    full_env.pop("LLAMA_SERVER_ROUTER_PORT", None)
    if child:
        full_env["LLAMA_SERVER_ROUTER_PORT"] = "0"
    full_env.update(env or {})
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
        start_new_session=True,
    )
    guard(process.pid)  # killed, with its group, if this process dies
    engine = EngineProcess(process)
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_lines, process.stdout, engine, False)
            nursery.start_soon(_read_lines, process.stderr, engine, True)
            try:
                yield engine
            finally:
                with trio.CancelScope(shield=True):
                    if process.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(process.pid, signal.SIGKILL)
                    await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    await pipe.aclose()
