"""The service's signals, on a real troupe process: a second signal exits 1 at once."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from troupe_rig.process import start_troupe
from troupe_rig.router import write_preset


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


async def test_sigterm_lets_streams_in_flight_finish_then_exits_0_with_no_child_left(
    fake_engine_path: Path, tmp_path: Path
) -> None:
    # The fake generates slowly (a fault the tiny real models cannot produce on demand):
    # SIGTERM arrives mid-stream, the stream must still end normally.
    preset = write_preset(tmp_path, {"slow": {"fake-tps": "20", "fake-tokens": "30"}})
    troupe = await start_troupe(
        ["--engine", str(fake_engine_path), "--models-preset", str(preset)],
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    )
    proc = troupe.process
    events: list[str] = []
    async with (
        trio.open_nursery() as nursery,
        httpx.AsyncClient(base_url=troupe.url, timeout=30) as http,
    ):
        nursery.start_soon(troupe.drain_log)
        body = {"model": "slow", "prompt": "x", "stream": True}
        async with http.stream("POST", "/completion", json=body) as resp:
            assert resp.status_code == 200
            children = psutil.Process(proc.pid).children(recursive=True)
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if not events:
                    proc.send_signal(signal.SIGTERM)  # mid-stream
                events.append(line)
        with trio.fail_after(30):
            assert await proc.wait() == 0
    assert len(events) == 31  # 30 tokens and the final event
    assert '"stop":true' in events[-1]
    _gone, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(children, timeout=5))
    assert not alive


def test_a_failure_raised_inside_the_service_is_one_line_and_its_exit_code(
    fake_engine_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A load-on-startup failure is raised inside the root nursery, so it arrives wrapped
    # in an exception group: the user must still see one line, not a traceback.
    from troupe import service  # noqa: PLC0415
    from troupe.cli import prepare_router  # noqa: PLC0415
    from troupe.errors import TroupeError  # noqa: PLC0415
    from troupe.service import run_service  # noqa: PLC0415

    async def failing(router: object) -> None:
        raise TroupeError("failed to load models on startup: a: model limit reached")

    monkeypatch.setattr(service, "load_on_startup", failing)
    preset = write_preset(tmp_path, {"a": {"load-on-startup": "true"}})
    prepared = prepare_router(
        [
            "--engine",
            str(fake_engine_path),
            "--models-preset",
            str(preset),
            "--port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
        ]
    )
    assert not isinstance(prepared, list)
    engine, table, settings = prepared
    assert run_service(settings, engine, table) == 1
    err = capsys.readouterr().err
    assert err.strip() == "troupe: error: failed to load models on startup: a: model limit reached"
