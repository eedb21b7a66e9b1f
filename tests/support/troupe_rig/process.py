"""troupe as a separate process, for tests of what only a process shows (signals, exit
codes, orphans)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import trio

from troupe_rig.reaper import guard

__all__ = ["TroupeProcess", "start_troupe"]


@attrs.define
class TroupeProcess:
    process: trio.Process
    url: str
    log: bytes  # stderr read so far

    async def read_log_until(self, marker: bytes, within: float = 30) -> None:
        """Read stderr until ``marker`` appears (it may be there already)."""
        assert self.process.stderr is not None
        with trio.fail_after(within):
            while marker not in self.log:
                chunk = await self.process.stderr.receive_some(65536)
                assert chunk, self.log.decode(errors="replace")
                self.log += chunk

    async def drain_log(self) -> None:
        """Keep reading stderr so the process never blocks on a full pipe."""
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.receive_some(65536):
            self.log += chunk


async def start_troupe(
    args: Sequence[str],
    *,
    state_dir: Path,
    cwd: Path | None = None,
    within: float = 60,
    port: int = 0,
    env: Mapping[str, str] | None = None,
) -> TroupeProcess:
    """``python -m troupe serve ARGS --port PORT`` (0: any free one), once it listens;
    ``env``: variables added to this process's environment."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "troupe", "serve", *args, "--port", str(port)],
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {}), "TROUPE_STATE_DIR": str(state_dir)},
        cwd=cwd,
    )
    guard(process.pid, state_dir)  # stopped, its children too, if this process dies
    started = TroupeProcess(process, "", b"")
    await started.read_log_until(b"listening on http", within)  # http:// or https://
    # The URL ends at a space, or at the quote that ends a --log-format json message.
    found = re.search(rb'listening on (https?://[^\s"]+)', started.log)
    assert found is not None, started.log.decode(errors="replace")
    started.url = found.group(1).decode()
    return started
