"""The service's signals, on a real troupe process: a second signal exits 1 at once."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import psutil
import trio

from troupe.testing.process import start_troupe
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
    troupe = await start_troupe(
        ["--engine", str(fake_engine_path), "--models-preset", str(preset)],
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    )
    proc = troupe.process
    async with httpx.AsyncClient(base_url=troupe.url, timeout=30) as http:
        resp = await http.post("/completion", json={"model": "stubborn", "prompt": "x"})
        assert resp.status_code == 200
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    proc.send_signal(signal.SIGTERM)
    await troupe.read_log_until(b"shutting down")
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await proc.wait() == 1
    _gone, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(children, timeout=5))
    assert not alive
