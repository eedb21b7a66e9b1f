"""Starting the router under test (troupe, or llama.cpp's own) and asking it about its models.

Both get the same flags: ``--models-dir`` / ``--models-preset``, ``--models-max``, the
child arguments (``-c 256 -t 1``) and ``--port 0``; troupe also its engine (the mixed
launcher, so a preset section with a ``fake-*`` knob runs the fake engine) and a state
directory (its PID ledger). Output goes to a log file, read for the ``listening on`` line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from _util import Proc, start_process
from chaos.client import Client
from chaos.procs import TAG_VAR, Tracker, fd_count, rss_bytes

TROUPE = "troupe"
CPP = "llama-server"
CHILD_ARGS = ("-c", "256", "-t", "1")


@dataclass
class Launch:
    """What one scenario asks of its router."""

    models_max: int = 2
    models_dir: Path | None = None
    preset: Path | None = None
    extra: tuple[str, ...] = ()  # for both routers
    troupe_extra: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


class Router:
    """One router process (or its successors, after a restart) and what was seen of it."""

    def __init__(
        self, kind: str, launch: Launch, *, engine: Path, mixed: Path, workdir: Path, tag: str
    ) -> None:
        self.kind = kind
        self.launch = launch
        self.engine = engine
        self.mixed = mixed
        self.workdir = workdir
        self.tag = tag
        self.tracker = Tracker()
        self.proc: Proc | None = None
        self.url = ""
        self.generation = 0
        self.exit_code: int | None = None
        self.client = Client("http://127.0.0.1:9")  # replaced once it listens

    @property
    def is_troupe(self) -> bool:
        return self.kind == TROUPE

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        la = self.launch
        flags = ["--host", "127.0.0.1", "--port", "0", *CHILD_ARGS]
        flags += ["--models-max", str(la.models_max)]
        if la.models_dir is not None:
            flags += ["--models-dir", str(la.models_dir)]
        if la.preset is not None:
            flags += ["--models-preset", str(la.preset)]
        flags += list(la.extra)
        if self.is_troupe:
            state = self.workdir / "state"
            return [sys.executable, "-m", "troupe", "serve", "--engine", str(self.mixed),
                    "--state-dir", str(state), *flags, *la.troupe_extra]  # fmt: skip
        return [str(self.engine), *flags]

    def spawn(self) -> None:
        """Start the process (tracked from now on), without waiting for it to listen."""
        env = {**os.environ, **self.launch.env, TAG_VAR: self.tag}
        env.pop("LLAMA_SERVER_ROUTER_PORT", None)
        self.generation += 1
        name = f"{self.kind}-{self.generation}"
        self.proc = start_process(name, self.argv(), self.workdir, env)
        if self.generation == 1:
            self.tracker.start(self.proc.pid)
        else:
            self.tracker.add_root(self.proc.pid)

    def start(self, within: float = 60.0) -> None:
        self.spawn()
        assert self.proc is not None
        self.url = self.proc.wait_listening(within)
        self.client = Client(self.url)

    def wait_exit(self, within: float) -> int | None:
        """The exit status, once it exited; None if it still runs after ``within`` s."""
        assert self.proc is not None
        try:
            self.exit_code = self.proc.popen.wait(within)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code

    def sigkill(self) -> None:
        assert self.proc is not None
        self.tracker.sample()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.popen.wait()

    def terminate(self, within: float) -> float | None:
        """SIGTERM; seconds until it exited, or None if it did not within ``within``."""
        assert self.proc is not None
        self.tracker.sample()
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        while time.monotonic() - t0 < within:
            self.tracker.sample()
            code = self.proc.popen.poll()
            if code is not None:
                self.exit_code = code
                return time.monotonic() - t0
            time.sleep(0.005)
        return None

    def close(self) -> None:
        """Stop it whatever state it is in (SIGTERM, then SIGKILL); sweep what it left."""
        if self.proc is not None:
            self.proc.known.update({s.pid: s.created or 0.0 for s in self.tracker.all()})
            self.proc.stop(20.0)
        self.tracker.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.popen.poll() is None

    def fds(self) -> int:
        return fd_count(self.pid)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        return self.proc.tail(lines) if self.proc else ""

    # --- the control plane ------------------------------------------------------------

    async def models(self, bound: float = 10.0) -> dict[str, dict[str, Any]]:
        data = await self.client.get_json("/models", bound)
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise RuntimeError(f"GET /models: unexpected answer {str(data)[:200]}")
        return {m["id"]: m for m in data["data"]}

    async def status(self, model: str) -> str:
        return str((await self.models())[model]["status"]["value"])

    async def wait_status(self, model: str, statuses: tuple[str, ...], within: float) -> bool:
        with trio.move_on_after(within):
            while True:
                with contextlib.suppress(RuntimeError, KeyError):
                    if await self.status(model) in statuses:
                        return True
                await trio.sleep(0.05)
        return False

    async def unload_all(self, within: float) -> list[str]:
        """Unload every running model; the names still running after ``within``."""
        running: list[str] = []
        asked: set[str] = set()
        with trio.move_on_after(within):
            while True:
                running = []
                with contextlib.suppress(RuntimeError):
                    for name, item in (await self.models()).items():
                        if item["status"]["value"] in ("unloaded", "downloaded"):
                            continue
                        running.append(name)
                        if name not in asked:
                            asked.add(name)
                            await self.client.call(
                                "POST", "/models/unload", {"model": name}, bound=5,
                                watch_after=False,
                            )  # fmt: skip
                if not running:
                    return []
                await trio.sleep(0.1)
        return running
