"""The measurement job's own process, from outside: a cancelled job never waits for a
spawn that does not return, and leaves no process behind when the spawn does return."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from troupe.actors import measure
from troupe.actors.measure import MeasureJob
from troupe.messages import MeasureFailed, Message


async def test_a_job_cancelled_during_a_spawn_that_hangs_ends_and_kills_what_it_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spawning, release = threading.Event(), threading.Event()
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def hanging(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        spawning.set()
        release.wait(30)  # the spawn that does not return (until the test says)
        proc = real([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(measure.subprocess, "Popen", hanging)
    send, recv = trio.open_memory_channel[Message](1)
    job = MeasureJob("m", "fp", ["llama-server"], {}, send)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(job.run)
            await trio.to_thread.run_sync(spawning.wait)
            job.cancel()  # the core gave up on it
        assert await recv.receive() == MeasureFailed("m", "fp", "cancelled")
    # The spawn returns after the job left: its process is killed there and then.
    release.set()
    with trio.fail_after(10):
        while not started or started[0].returncode is None:  # noqa: ASYNC110
            await trio.sleep(0.01)  # the worker thread reaps it; no event reaches here
    assert started[0].returncode == -9  # killed, and reaped (no zombie left)
