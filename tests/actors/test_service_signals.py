"""The service's signals, on a real troupe process: a second signal exits 1 at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import trio

from troupe.testing.router import write_preset


async def test_second_signal_exits_1_at_once_and_leaves_no_child(
    fake_engine_path: Path, tmp_path: Path
) -> None:
    # A child that ignores both the exit command and SIGTERM would hold a graceful
    # shutdown for its whole stop-timeout; the second signal cuts that short.
    preset = write_preset(
        tmp_path,
        {"stubborn": {"fake-ignore-exit": "1", "fake-ignore-sigterm": "1", "stop-timeout": "60"}},
    )
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "troupe",
            "serve",
            "--engine",
            str(fake_engine_path),
            "--models-preset",
            str(preset),
            "--port",
            "0",
        ],
        stderr=subprocess.PIPE,
        env={**os.environ, "TROUPE_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    log = b""
    with trio.fail_after(60):
        while b"listening on http://" not in log:
            chunk = await proc.stderr.receive_some(65536)
            assert chunk, log.decode(errors="replace")
            log += chunk
    url = log.split(b"listening on ", 1)[1].split()[0].decode()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        resp = await http.post("/completion", json={"model": "stubborn", "prompt": "x"})
        assert resp.status_code == 200
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(30):
        while b"shutting down" not in log:
            log += await proc.stderr.receive_some(65536)
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await proc.wait() == 1
    _gone, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(children, timeout=5))
    assert not alive
